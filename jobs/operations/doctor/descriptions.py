"""doctor: what each store says it holds (serializers/FORMAT.md "The stores' description")
against feature_defs/stored.lock and the definitions: a store whose description disagrees
with the lock, or holds a defined feature's stored name as something the readers refuse."""

from __future__ import annotations

import psycopg
import redis

from feature_defs import Definitions
from fm_config import RunConf
from jobs.operations.doctor.line import DoctorLine
from serializers.description import COMPATIBLE, Description, Held, conflict
from sinks.redis.config import redis_sink_config
from sinks.redis.description import read_description
from sinks.sql.config import sql_sink_config
from sinks.sql.description import read_descriptions
from stores.errors import TerminalError, TransientError
from stores.sql import connect

STORE_NAMES = {"redis": "redis", "sql": "sql"}


def _found(conf: RunConf, defs: Definitions, store: str) -> dict[str, Description]:
    """Entity type -> its description in ``store`` (empty: undescribed)."""
    if store == "redis":
        mode = conf.redis.mode
        cluster = None if mode == "auto" else mode == "cluster"
        return {name: read_description(redis_sink_config(conf, None, e), cluster) for name, e in defs.entities.items()}
    tables = {e.sql_table: name for name, e in defs.entities.items()}
    with connect(sql_sink_config(conf)) as conn:
        try:
            found = read_descriptions(conn, conf.sql.db_schema, sorted(tables))
        except psycopg.errors.UndefinedTable:
            found = {}
    return {name: found.get(table, {}) for table, name in tables.items()}


def _next_run_records(got: Held, want: Held) -> bool:
    """The lock is ahead of the store the way ``defs --lock`` leaves it before the next run:
    a name retired since, or an encoding changed to one that reads the stored bytes alike."""
    if got.source != want.source or got.retired:
        return False
    if want.retired:
        return got.encoding == want.encoding
    return (got.encoding, want.encoding) in COMPATIBLE


def check_descriptions(conf: RunConf, defs: Definitions, sinks: list[str]) -> list[DoctorLine]:
    checks = []
    for store in sinks:
        label = f"{STORE_NAMES[store]} description"
        try:
            found = _found(conf, defs, store)
        except (TransientError, redis.ConnectionError, redis.TimeoutError, psycopg.OperationalError, OSError):
            continue  # the store's own check says it cannot be reached
        except TerminalError as exc:  # e.g. an ACL without the description's key
            checks.append(DoctorLine("fail", label, str(exc).splitlines()[0], "conf/base/redis-acl.txt, conf/base/sql-grants.sql"))
            continue
        problems, behind = [], []
        for source in defs.sources.values():
            held = found.get(source.entity, {})
            for f in source.features:
                why = conflict(held.get(f.stored_name), source.name, f.encoding)
                if why:
                    problems.append(f"{source.name}:{f.name}: stored name {f.stored_name!r} is {why} (readers answer INVALID)")
        if defs.lock is not None:
            for entity, names in sorted(defs.lock.entities.items()):
                held = found.get(entity, {})
                if not held:
                    continue
                for name, entry in sorted(names.items()):
                    want = Held(entry.encoding, entry.source, bool(entry.retired))
                    got = held.get(name)
                    if got is None or got == want:
                        continue
                    if _next_run_records(got, want):
                        behind.append(name)
                    else:
                        problems.append(f"{entity}: {name!r}: the store holds {got.text()!r}, stored.lock says {want.text()!r}")
                for name in sorted(set(held) - set(names)):
                    problems.append(f"{entity}: {name!r}: the store holds {held[name].text()!r}, which stored.lock does not record")
        undescribed = sorted(e for e in defs.entities if defs.sources_of(e) and not found.get(e))
        if problems:
            checks.append(
                DoctorLine(
                    "fail",
                    label,
                    "; ".join(problems),
                    "deploy the definitions the stores were written with, or give changed features fresh storage "
                    "(`stored_as`, feature_defs/README.md) and run them; `materialize defs --lock` records the definitions",
                )
            )
        elif undescribed:  # a store no run has written yet, or one written before descriptions: read as written
            checks.append(DoctorLine("ok", label, f"not described yet: {', '.join(undescribed)} (the next run describes them)"))
        else:
            later = f"; the next run records {', '.join(sorted(behind))} as stored.lock says" if behind else ""
            checks.append(
                DoctorLine("ok", label, f"{len(found)} entity type(s) described; it agrees with the definitions and stored.lock{later}")
            )
    return checks
