"""``doctor``: is this deployment ready to run (jobs/operations/doctor/)."""

from __future__ import annotations

from jobs.cli.common import common_flags, load
from jobs.exit_codes import (
    EXIT_FAILED,
    EXIT_OK,
)


def add_doctor(sub) -> None:
    doc = sub.add_parser(
        "doctor", help="check, without writing anything, that a deployment is ready to run",
        description="Read-only checks of everything a run needs: the Spark master (or Java and the Delta jars), each source's "
        "Delta table and its columns, the ledger, leases, quarantine and report locations, Redis (mode, cluster slots, memory "
        "headroom, eviction policy, listpack settings, the user's ACL) and SQL (dialect, tables, grants). One line per check, "
        "with what to fix; exit code 1 when any check fails.",
    )  # fmt: skip
    common_flags(doc)
    doc.add_argument("--source", action="append", help="only this source (repeatable; default: the run's sources)")
    doc.add_argument(
        "--sink", choices=["redis", "sql", "cockroach", "all"], default="all", help="only this store (default: the configured sinks)"
    )


def cmd_doctor(args) -> int:
    from jobs.operations.doctor.run import run_checks

    conf, defs = load(args)
    names = args.source or conf.sources or list(defs.sources)
    for name in names:
        defs.source(name)
    print(f"materialize doctor: env {conf.env}, {len(names)} source(s), stores {', '.join(conf.sinks)} (read-only: nothing is written)")
    counts = {"ok": 0, "warn": 0, "fail": 0}
    for check in run_checks(conf, defs, names, list(conf.sinks)):
        counts[check.status] += 1
        print("\n".join(check.lines()), flush=True)
    print(f"{sum(counts.values())} checks: {counts['ok']} ok, {counts['warn']} warning(s), {counts['fail']} failed")
    return EXIT_FAILED if counts["fail"] else EXIT_OK
