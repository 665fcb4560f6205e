"""``materialize doctor``: is this deployment ready to run? Read-only checks of the Spark
master, each source table, the ledger/quarantine/report locations, Redis and SQL.

Nothing is written anywhere: Redis ACLs are probed by queueing the writer's commands in a
``MULTI`` that is discarded (Redis checks permissions when a command is queued), and the SQL
session is read-only. A Delta source's schema is read from its Delta log, without Spark; a
Parquet or catalog-table source is opened as a run opens it (one Spark session, started for
the first of them, reads its schema and no rows). Each check is one line with what to fix
when it is not OK."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from feature_defs import Definitions
from fm_config import RunConf
from jobs.extras import TITLES, install_hint, missing_extra
from jobs.operations.doctor.line import DoctorLine
from jobs.operations.doctor.locations import check_location, check_log_store, locations
from jobs.operations.doctor.redis import check_redis
from jobs.operations.doctor.server import check_server
from jobs.operations.doctor.sources import check_source
from jobs.operations.doctor.spark import check_spark
from jobs.operations.doctor.sql import check_sql


def run_checks(conf: RunConf, defs: Definitions, sources: list[str], sinks: list[str]) -> Iterator[DoctorLine]:
    """Every check, in the order a run needs them (each one's own errors become its FAIL),
    then the read side's (reads.py)."""
    from jobs.operations.doctor.descriptions import check_descriptions
    from jobs.operations.doctor.push import push_steps
    from jobs.operations.doctor.reads import check_redis_transport, read_side_steps
    from jobs.operations.doctor.stores import check_stored_data

    steps: list[tuple[str, Callable[[], list[DoctorLine]]]] = [("spark", lambda: check_spark(conf))]
    steps += [(f"source {name}", lambda name=name: [check_source(conf, defs, defs.source(name))]) for name in sources]
    steps += [(label, lambda label=label, where=where: [check_location(conf, label, where)]) for label, where in locations(conf)]
    steps.append(("ledger log store", lambda: check_log_store(conf)))
    if "redis" in sinks:
        steps.append(("redis transport", lambda: check_redis_transport(conf)))
        steps.append(("redis", lambda: check_redis(conf, defs, sources)))
    if "sql" in sinks:
        steps.append(("sql", lambda: check_sql(conf, defs, sources)))
    steps.append(("stored data", lambda: check_stored_data(conf, defs, sources, sinks)))  # against the ledger
    # steps that yielded a FAIL: a Redis URL whose scheme its port does not speak is not asked
    # again (each read would wait for its timeout)
    failed: set[str] = set()
    reached = {"redis": ("redis transport",), "sql": ()}
    steps.append(
        (
            "descriptions",  # against the lock and the definitions
            lambda: check_descriptions(conf, defs, [s for s in sinks if not failed.intersection(reached[s])]),
        )
    )
    steps += read_side_steps(conf, defs, sources, sinks)
    steps.append(("server", lambda: check_server(conf)))
    steps += push_steps(conf, defs, sinks)
    for name, step in steps:
        try:
            for check in step():
                if check.status == "fail":
                    failed.add(name)
                yield check
        except Exception as exc:  # noqa: BLE001 (a check that could not finish is a finding, not a crash)
            if missing := missing_extra(exc):  # e.g. doctor run where only the reader is installed
                yield DoctorLine(
                    "fail",
                    name,
                    f"could not check: {missing[0]} is not installed",
                    f"{install_hint(missing[1])} (the {TITLES[missing[1]]} extra)",
                )
                continue
            failed.add(name)
            yield DoctorLine("fail", name, f"could not check: {type(exc).__name__}: {str(exc).strip() or 'no message'}")
