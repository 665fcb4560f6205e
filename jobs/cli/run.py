"""Running a date and checking it: ``run``, ``validate``, ``verify``, ``ready`` and ``report``."""

from __future__ import annotations

import datetime as dt
import sys

from jobs.cli.common import UsageError, common_flags, date_arg, each_source, instant_arg, lease_wait_flag, load, parallel_flag, store_lost
from jobs.exit_codes import (
    EXIT_FAILED,
    EXIT_NOT_READY,
    EXIT_OK,
)


def add_run(sub) -> None:
    run = sub.add_parser(
        "run",
        help="materialize one date (or, by event time, an incremental window) of one or all sources",
        description="Read one date's snapshot, check it, quarantine bad rows, write it to the online stores and print a summary. "
        "Each store is first compared with what the run ledger recorded: one that lost data written before (emptied, "
        "restarted without persistence) is named with the backfill that restores it, and the run exits 6 after writing. "
        "A date without rows is not ready: exit code 3, nothing written or recorded in the ledger. "
        "A source selected by event time (select_by: event_time) writes each entity's latest row by event time, as of that "
        "event time: with --date, of every row up to the end of the date; with --incremental, of the rows since the end of the "
        "last window the ledger recorded for it, less its lookback_seconds (default one day, for rows that arrive late), up to "
        "now or --until; a window ends no later than when the run reads the table (rows of later event times are left to the next "
        "run). The window moves on only when a run succeeds: a failed or crashed run is covered again by the next.",
    )
    common_flags(run)
    when = run.add_mutually_exclusive_group(required=True)
    when.add_argument("--date", type=date_arg, help="the snapshot date (the source's date partition), YYYY-MM-DD; at most tomorrow (UTC)")
    when.add_argument(
        "--incremental",
        action="store_true",
        help="sources selected by event time: continue from the end of the last window the ledger recorded (less the "
        "source's lookback_seconds) up to now or --until; a source's first incremental run covers everything up to its end",
    )
    run.add_argument(
        "--until",
        type=instant_arg,
        metavar="TIME",
        help="with --incremental: the end of the window (excluded), ISO 8601, UTC unless an offset is given "
        "(default: now; at most the end of tomorrow, UTC; one still to come is cut at the time the run reads the table)",
    )
    run.add_argument("--source", action="append", help="source (ETL table) to run; repeat for several (default: all configured)")
    parallel_flag(run)
    run.add_argument(
        "--sink",
        choices=["redis", "sql", "cockroach", "all"],
        default="all",
        help="store to write: redis, sql (CockroachDB or PostgreSQL; cockroach, its old name, still works), "
        "or all = the configured 'sinks' (default)",
    )
    run.add_argument("--redis-url", help="Redis URL overriding the config (put no password in it: use the password env var)")
    run.add_argument("--sql-dsn", help="SQL store connection string overriding sql.dsn (no password in it: use sql.password_env)")
    lease_wait_flag(run)


def add_validate(sub) -> None:
    val = sub.add_parser(
        "validate",
        help="run the data-quality checks of one date without writing",
        description="Read one date's snapshot and run the checks a run would (expectations derived from the feature "
        "definitions, the bad-row limit), without writing anything. Prints the verdict; the report goes to "
        "reports/<source>/<date>/validation.json and the HTML data docs to reports/<source>/<date>/data_docs/.",
    )
    common_flags(val)
    val.add_argument("--date", required=True, type=date_arg, help="the snapshot date, YYYY-MM-DD; at most tomorrow (UTC)")
    val.add_argument("--source", action="append", help="source to check; repeat for several (default: all configured)")
    parallel_flag(val)


def add_verify(sub) -> None:
    ver = sub.add_parser(
        "verify",
        help="read a sample back from the stores and compare it with the source",
        description="Read a random sample (quality.verify_sample) of one date's entities back from every configured store, "
        "decode it and compare it with the source rows; writes nothing. Report: reports/<source>/<date>/verification.json.",
    )
    common_flags(ver)
    ver.add_argument("--date", required=True, type=date_arg, help="the snapshot date, YYYY-MM-DD; at most tomorrow (UTC)")
    ver.add_argument("--source", action="append", help="source to check; repeat for several (default: all configured)")
    parallel_flag(ver)
    ver.add_argument("--redis-url", help="Redis URL overriding the config")


def add_ready(sub) -> None:
    ready = sub.add_parser(
        "ready",
        help="exit 0 when a source has rows for a date (for sensors)",
        description="Exit 0 when the source table has rows for --date (a long layout: rows of its defined feature names; "
        "by event time: rows of the day, UTC), 3 when it has none yet. A Delta table or Parquet files on this machine are "
        "read without Spark (the Delta log or the Parquet footers, then the few files they cannot rule out); a catalog "
        "table or a location behind a URI is asked of Spark.",
    )
    common_flags(ready)
    ready.add_argument("--date", required=True, type=date_arg)
    ready.add_argument("--source", required=True)


def add_report(sub) -> None:
    rep = sub.add_parser(
        "report",
        help="print a run's summary from its report",
        description="Print the summary table of reports/<source>/<date>/summary.json (no Spark needed). "
        "A source run with --incremental has a report per run, named by its window's end "
        "(reports/<source>/<date>T<HHMMSS>Z/): without a report of the date itself, the last "
        "incremental run that ended on the date is printed, and the others named.",
    )
    common_flags(rep)
    rep.add_argument("--date", required=True, type=date_arg)
    rep.add_argument("--source", required=True)


def cmd_run(args) -> int:
    from jobs.operations.backfill import recorded_run
    from jobs.operations.ledger.events import Ledger
    from serializers.horizon import check_date, check_until

    until = select = None
    if args.incremental:
        from jobs.event_time import EventWindow, utc_text

        # the clock read once, for every source of the command (each records the end it covered)
        until = args.until or dt.datetime.now(dt.UTC).replace(microsecond=0)
        check_until(until)  # before Spark starts
        window = EventWindow(None, until, incremental=True)
        args.date, args.report_name, select = window.date, window.report_name, incremental_sources
        args.covering = f"up to {utc_text(until)}"
    elif args.until:
        raise UsageError("--until is the end of an incremental window: give it with --incremental, not --date")
    else:
        check_date(args.date)  # before Spark starts

    def run(spark, conf, defs, name):
        from jobs.run_metrics import report_run

        try:
            summary = recorded_run(
                spark, conf, defs, Ledger.of(spark, conf), "run", name, args.date, redis_url=args.redis_url, guard_skipped_newer=True,
                until=until,
            )  # fmt: skip
        except Exception as exc:
            report_run(conf, defs.source(name), _failed_summary(conf, name, args), exc)
            raise
        report_run(conf, defs.source(name), summary, None)
        return summary

    # the ledger made before the sources run at once: two first appends would both create it
    return each_source(
        args, run, "summary.json", setup=lambda spark, conf: Ledger.of(spark, conf).create(), expectations=None, select=select
    )


def _failed_summary(conf, name: str, args):
    """The summary a failed run wrote (its counts: the bad-row fraction a gate stopped), if any."""
    from jobs.pipeline.report.stage import report_dir
    from jobs.pipeline.report.summary import RunSummary

    try:
        folder = report_dir(conf, name, args.date, name=getattr(args, "report_name", None))
        found = RunSummary.read_json(folder / "summary.json", conf.files)
    except Exception:  # noqa: BLE001 (none written: the run failed before its report)
        return None
    return None if found.status == "succeeded" else found  # an earlier run's, not this one's


def incremental_sources(defs, names: list[str], named: bool) -> list[str]:
    """Of the sources to run, those selected by event time: naming one selected by date is a mistake."""
    by_date = [name for name in names if not defs.source(name).by_event_time]
    if named and by_date:
        raise UsageError(f"--incremental runs sources selected by event time; {', '.join(by_date)} select(s) by date: run a date (--date)")
    if by_date:
        print(f"not run (selected by date: run them with --date): {', '.join(by_date)}", flush=True)
    chosen = [name for name in names if name not in by_date]
    if not chosen:
        raise UsageError("no source selects by event time (select_by: event_time): --incremental has nothing to run")
    return chosen


def cmd_validate(args) -> int:
    from jobs.pipeline.run import validate_source
    from serializers.horizon import check_date

    check_date(args.date)
    return each_source(
        args, lambda spark, conf, defs, name: validate_source(spark, conf, defs, name, args.date), "validation.json", expectations=True
    )


def cmd_verify(args) -> int:
    from jobs.pipeline.run import verify_source
    from serializers.horizon import check_date

    check_date(args.date)
    return each_source(
        args,
        lambda spark, conf, defs, name: verify_source(spark, conf, defs, name, args.date, redis_url=args.redis_url),
        "verification.json",
    )


def cmd_ready(args) -> int:
    from jobs.pipeline.ready_files import has_rows
    from jobs.pipeline.source_table import check_catalog

    conf, defs = load(args)
    source = defs.source(args.source)
    check_catalog(conf, [source])
    found = has_rows(conf, source, args.date)  # the table's files, without a JVM: None where Spark must say
    if found is None:
        from jobs.pipeline.read import partition_rows
        from jobs.spark import build_spark

        found = bool(partition_rows(build_spark(conf.spark, conf.locations(defs)), conf, source, args.date))
    if found:
        print(f"{source.name} has rows for {args.date}")
        return EXIT_OK
    print(f"{source.name} has no rows for {args.date} yet")
    return EXIT_NOT_READY


def cmd_report(args) -> int:
    from jobs.pipeline.report.stage import report_path
    from jobs.pipeline.report.summary import RunSummary, SummaryError

    conf, defs = load(args)
    defs.source(args.source)
    path, earlier = report_path(conf, args.source, args.date), []
    try:
        found = conf.files.is_file(path)
        if not found:  # incremental runs of the source: a report each, named by its window's end
            runs = [f for f in conf.files.folders(conf.reports_path / args.source) if f.startswith(f"{args.date.isoformat()}T")]
            runs = [f for f in runs if conf.files.is_file(conf.reports_path / args.source / f / "summary.json")]
            if runs:
                path, found = conf.reports_path / args.source / runs[-1] / "summary.json", True
                earlier = [str(conf.reports_path / args.source / f) for f in runs[:-1]]
    except OSError as exc:
        print(f"error: cannot reach the reports at {conf.reports_path}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if not found:
        print(f"error: no report at {path}: {args.source} {args.date} has not run with this config", file=sys.stderr)
        return EXIT_FAILED
    try:
        summary = RunSummary.read_json(path, conf.files)
    except SummaryError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    print(summary.table())
    print(f"report: {path}")
    if earlier:
        print(f"earlier incremental runs that ended on {args.date}: {', '.join(earlier)}")
    if summary.status == "not ready":
        return EXIT_NOT_READY
    if summary.status != "succeeded":
        return EXIT_FAILED
    return store_lost(summary.store_loss)
