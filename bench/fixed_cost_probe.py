"""Where a `materialize` process spends its seconds: the command run with timing wrappers on
the steps that cost the same whatever the data (the JVM and session, the ledger, the leases,
great-expectations' context) and on each source's run, every call of every thread recorded.

    python -m bench.fixed_cost_probe OUT.json run --date 2026-12-06 --sink redis

Writes OUT.json: the process's wall time from the interpreter's start (``time.time()`` less
the process's age from /proc), the import of the command line, and per step its calls (thread,
start and end, seconds from the interpreter's start). Development tooling (bench/fixed_cost.py
runs it): it patches the product's functions from outside, the product never imports it.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
import time

CALLS: list[dict] = []
_lock = threading.Lock()


def _process_start() -> float:
    """The epoch time this process started (Linux: /proc/self/stat's start time in clock ticks after boot)."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        boot = next(int(line.split()[1]) for line in f if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")


START = _process_start()


def _now() -> float:
    return time.time() - START


def _wrap(owner, name: str, step: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args, **kwargs):
        began = _now()
        try:
            return original(*args, **kwargs)
        finally:
            with _lock:
                CALLS.append({"step": step, "thread": threading.current_thread().name, "start": round(began, 3), "end": round(_now(), 3)})

    setattr(owner, name, timed)


def _patch() -> None:
    import jobs.spark
    from jobs.cli import common
    from jobs.cli import run as run_commands
    from jobs.operations import backfill
    from jobs.operations.ledger import events, lease
    from jobs.pipeline.gate import checks

    for owner, name, step in (
        (jobs.spark, "build_spark", "JVM and Spark session"),
        (common, "load", "config and definitions"),
        (run_commands, "load", "config and definitions"),  # ready and report call it by the name they imported
        (events.Ledger, "create", "ledger: create"),
        (events.Ledger, "start", "ledger: record start"),
        (events.Ledger, "finish", "ledger: record end"),
        (events.Ledger, "write_steps", "ledger: read (stored names)"),
        (events.Ledger, "source_steps", "ledger: read (windows)"),
        (lease.Leases, "take", "lease: take"),
        (lease.Leases, "release", "lease: release"),
        (lease.Leases, "renew", "lease: renew"),
        (backfill, "check_stores", "stores compared with the ledger"),
        (backfill, "run_source", "source run (its stages)"),
        (checks, "_gx_context", "great-expectations context"),
    ):
        _wrap(owner, name, step)


def main() -> int:
    out, argv = sys.argv[1], sys.argv[2:]
    imported = _now()
    from jobs.cli import main as materialize

    cli_imported = _now()
    _patch()
    code = materialize(argv)
    ended = _now()
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is not None:  # the session stops at exit otherwise: timed here, as the process pays it
        spark.stop()
    record = {
        "exit_code": code,
        "interpreter_start_s": round(imported, 3),
        "cli_import_s": round(cli_imported - imported, 3),
        "command_s": round(ended - cli_imported, 3),
        "spark_stop_s": round(_now() - ended, 3),
        "calls": CALLS,
    }
    with open(out, "w") as f:
        json.dump(record, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
