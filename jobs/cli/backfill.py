"""Date ranges and the ledger: ``backfill`` and ``runs``."""

from __future__ import annotations

import sys

from jobs.cli.common import common_flags, date_arg, lease_wait_flag, load, retry_cannot_fix, store_lost
from jobs.exit_codes import (
    EXIT_FAILED,
    EXIT_GATE_FAILED,
    EXIT_LEASE_HELD,
    EXIT_NOT_READY,
    EXIT_OK,
    EXIT_TERMINAL,
    EXIT_USAGE,
)


def add_backfill(sub) -> None:
    back = sub.add_parser(
        "backfill",
        help="write a range of dates (repair missed nights, load a feature's history)",
        description="Write the dates --start..--end of one source. 'latest' (default) writes, in one pass, each entity's "
        "latest good row across the range (the state applying the dates in order leaves, one write per entity); "
        "'replay' runs the dates one by one. Dates the ledger shows as written to the same sinks are skipped unless "
        "--force, so a failed backfill resumes where it stopped when run again; dates a store has lost since they "
        "were written are written again. Dates without rows are not ready: listed "
        "and skipped (exit code 3 when no date of the range has rows).",
    )
    common_flags(back)
    back.add_argument("--source", required=True, help="the source (ETL table)")
    back.add_argument("--start", required=True, type=date_arg, help="first date, YYYY-MM-DD")
    back.add_argument("--end", required=True, type=date_arg, help="last date, YYYY-MM-DD; at most tomorrow (UTC)")
    back.add_argument(
        "--sink", choices=["redis", "sql", "cockroach", "all"], default="all", help="store(s) to write (default: the configured sinks)"
    )
    back.add_argument("--mode", choices=["latest", "replay"], default="latest", help="latest: one pass (default); replay: date by date")
    back.add_argument("--force", action="store_true", help="write dates the ledger shows as already written")
    back.add_argument("--dry-run", action="store_true", help="print the plan (dates, sinks, estimated rows and bytes); write nothing")
    back.add_argument("--redis-url", help="Redis URL overriding the config")
    back.add_argument("--sql-dsn", help="SQL store connection string overriding sql.dsn (no password)")
    lease_wait_flag(back)


def add_runs(sub) -> None:
    runs = sub.add_parser(
        "runs", help="list the run ledger", description="List runs, backfill steps and cleanups from the ledger, newest first."
    )
    common_flags(runs)
    runs.add_argument("--source", help="only this source")
    runs.add_argument("--last", type=int, default=20, help="how many (default 20)")


def cmd_backfill(args) -> int:
    from jobs.operations.backfill import BackfillError, plan_backfill, run_backfill, spans
    from jobs.operations.ledger.events import Ledger
    from jobs.operations.ledger.lease import LeaseHeld
    from jobs.pipeline.gate.checks import QualityGateError
    from jobs.pipeline.source_table import check_catalog
    from jobs.spark import build_spark
    from serializers.horizon import check_date

    check_date(args.end, "--end")  # before Spark starts
    conf, defs = load(args, expectations=None)
    check_catalog(conf, [defs.source(args.source)])
    spark = build_spark(conf.spark, conf.locations(defs))
    ledger = Ledger.of(spark, conf)
    try:
        plan = plan_backfill(spark, conf, defs, ledger, args.source, args.start, args.end, args.mode, args.force, args.redis_url)
    except BackfillError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(plan.describe(), flush=True)
    if args.dry_run:
        print("dry run: nothing written")
        return EXIT_OK
    if not plan.to_write:
        if not plan.already_written:
            print(f"not ready: source {args.source} has no rows dated {args.start}..{args.end}: nothing to write", file=sys.stderr)
            return EXIT_NOT_READY
        print(f"nothing to write: every date with data in {args.start}..{args.end} is already written (--force to write again)")
        return EXIT_OK
    try:
        summaries = run_backfill(spark, conf, defs, ledger, plan, redis_url=args.redis_url)
    except LeaseHeld as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_LEASE_HELD
    except BackfillError as exc:
        if exc.__cause__ is not None and retry_cannot_fix(exc.__cause__):
            print(f"error: {exc}\nfix that, then run the same command again to resume", file=sys.stderr)
            return EXIT_GATE_FAILED if isinstance(exc.__cause__, QualityGateError) else EXIT_TERMINAL
        print(f"error: {exc}\nrun the same command again to resume", file=sys.stderr)
        return EXIT_FAILED
    for summary in summaries:
        print(summary.table())
    if plan.no_rows:
        print(f"not ready (no rows), skipped: {spans(plan.no_rows)}; the other dates are written")
    return store_lost(summaries[-1].store_loss if summaries else [])


def cmd_runs(args) -> int:
    from jobs.event_time import cut_note
    from jobs.operations.ledger.events import Ledger, aware
    from jobs.spark import build_spark

    conf, defs = load(args)
    ledger = Ledger.of(build_spark(conf.spark, conf.locations(defs)), conf)
    rows = ledger.list(args.source, args.last)
    if not rows:
        print(f"no runs recorded in {conf.ledger_path}")
        return EXIT_OK
    print(
        f"{'started (UTC)':<20} {'kind':<16} {'source':<22} {'dates':<23} {'sinks':<16} {'status':<10} {'entities':>9}  {'code':<13} error"
    )
    for r in rows:
        dates = str(r["start_date"]) + (f"..{r['end_date']}" if r["end_date"] != r["start_date"] else "")
        started = r["started_at"].strftime("%Y-%m-%d %H:%M:%S") if r["started_at"] else ""
        entities = f"{r['entities']:,}" if r["entities"] is not None else ""
        error = (r["error"] or "")[:80]
        print(
            f"{started:<20} {r['kind']:<16} {r['source'] or '':<22} {dates:<23} {','.join(r['sinks'] or []):<16} "
            f"{r['status']:<10} {entities:>9}  {r['code_version'] or '':<13} {error}"
        )
        if r.get("window_end"):  # selected by event time: the event times it covered
            start = f"{r['window_start']:%Y-%m-%d %H:%M:%S}" if r.get("window_start") else "the first row"
            print(f"{'':<20} event times from {start} to {r['window_end']:%Y-%m-%d %H:%M:%S} (UTC, end excluded)")
            if r.get("window_requested_end"):
                print(f"{'':<20} {cut_note(aware(r['window_requested_end']))}")
    return EXIT_OK
