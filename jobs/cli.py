"""``materialize``: the command line of feature-materializer."""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import threading
from collections.abc import Sequence

from jobs.exit_codes import (
    EXIT_FAILED,
    EXIT_GATE_FAILED,
    EXIT_LEASE_HELD,
    EXIT_NOT_READY,
    EXIT_OK,
    EXIT_STORE_LOST,
    EXIT_TERMINAL,
    EXIT_USAGE,
)


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None


def _instant(text: str) -> dt.datetime:
    """An ISO 8601 time; UTC unless it says otherwise (2026-11-27T06:00:00Z, 2026-11-27T08:00:00+02:00, 2026-11-27)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time (ISO 8601, e.g. 2026-11-27T06:00:00Z): {text!r}") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


class UsageError(ValueError):
    """Flags that do not fit together, or sources a command cannot run (exit code 2)."""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", help="config env: conf/base + conf/<env> (default: $FM_ENV, else 'local')")
    p.add_argument("--data-root", help="folder the sources' locations are under: Delta tables, Parquet files (overrides data_root)")


def _lease_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait-for-lease", type=float, metavar="SECONDS",
        help="when another run is writing the same source and store, wait up to this long for it to end "
        "(default: lease.wait_seconds, 0: stop at once, exit code 5)",
    )  # fmt: skip


def _parallel(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="sources worked on at once in the one Spark session (overrides parallel_sources, default 2)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="materialize",
        description="Materialize ML features from Delta tables into the online stores (Redis, CockroachDB).",
        epilog="Examples:\n  materialize sample-data\n  materialize run --env local --date 2026-11-20\n"
        "  materialize run --env local --date 2026-11-20 --sink cockroach --source consumer_daily\n"
        "  materialize run --env local --incremental --source driver_hourly_stats\n"
        "  materialize validate --env local --date 2026-11-20\n"
        "  materialize backfill --env local --source consumer_daily --start 2026-11-16 --end 2026-11-20 --dry-run\n"
        "  materialize runs --last 10\n  materialize cleanup --env local --entity consumer --dry-run\n"
        "  materialize defs --source consumer_daily\n  materialize doctor --env prod\n"
        "  materialize import-feast my_project/feature_repo --out feast_defs/my_project\n"
        '  echo \'{"features": ["consumer_daily:orders_7d"], "entities": {"consumer_id": [1, 2]}}\' | materialize get --env local',
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands = (_run_command, _validate_command, _backfill_command, _bench_command, _runs_command, _cleanup_command)
    for add in (
        *commands,
        _verify_command,
        _get_command,
        _serve_command,
        _schema_command,
        _ready_command,
        _report_command,
        _doctor_command,
        _sample_data_command,
        _defs_command,
        _import_feast_command,
    ):
        add(sub)  # in --help's order
    return parser


def _run_command(sub) -> None:
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
    _common(run)
    when = run.add_mutually_exclusive_group(required=True)
    when.add_argument("--date", type=_date, help="the snapshot date (the source's date partition), YYYY-MM-DD; at most tomorrow (UTC)")
    when.add_argument(
        "--incremental",
        action="store_true",
        help="sources selected by event time: continue from the end of the last window the ledger recorded (less the "
        "source's lookback_seconds) up to now or --until; a source's first incremental run covers everything up to its end",
    )
    run.add_argument(
        "--until",
        type=_instant,
        metavar="TIME",
        help="with --incremental: the end of the window (excluded), ISO 8601, UTC unless an offset is given "
        "(default: now; at most the end of tomorrow, UTC; one still to come is cut at the time the run reads the table)",
    )
    run.add_argument("--source", action="append", help="source (ETL table) to run; repeat for several (default: all configured)")
    _parallel(run)
    run.add_argument(
        "--sink",
        choices=["redis", "cockroach", "all"],
        default="all",
        help="store to write: redis, cockroach (CockroachDB or PostgreSQL), or all = the configured 'sinks' (default)",
    )
    run.add_argument("--redis-url", help="Redis URL overriding the config (put no password in it: use the password env var)")
    run.add_argument("--sql-dsn", help="SQL store connection string overriding sql.dsn (no password in it: use sql.password_env)")
    _lease_wait(run)


def _validate_command(sub) -> None:
    val = sub.add_parser(
        "validate",
        help="run the data-quality checks of one date without writing",
        description="Read one date's snapshot and run the checks a run would (expectations derived from the feature "
        "definitions, the bad-row limit), without writing anything. Prints the verdict; the report goes to "
        "reports/<source>/<date>/validation.json and the HTML data docs to reports/<source>/<date>/data_docs/.",
    )
    _common(val)
    val.add_argument("--date", required=True, type=_date, help="the snapshot date, YYYY-MM-DD; at most tomorrow (UTC)")
    val.add_argument("--source", action="append", help="source to check; repeat for several (default: all configured)")
    _parallel(val)


def _backfill_command(sub) -> None:
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
    _common(back)
    back.add_argument("--source", required=True, help="the source (ETL table)")
    back.add_argument("--start", required=True, type=_date, help="first date, YYYY-MM-DD")
    back.add_argument("--end", required=True, type=_date, help="last date, YYYY-MM-DD; at most tomorrow (UTC)")
    back.add_argument(
        "--sink", choices=["redis", "cockroach", "all"], default="all", help="store(s) to write (default: the configured sinks)"
    )
    back.add_argument("--mode", choices=["latest", "replay"], default="latest", help="latest: one pass (default); replay: date by date")
    back.add_argument("--force", action="store_true", help="write dates the ledger shows as already written")
    back.add_argument("--dry-run", action="store_true", help="print the plan (dates, sinks, estimated rows and bytes); write nothing")
    back.add_argument("--redis-url", help="Redis URL overriding the config")
    back.add_argument("--sql-dsn", help="SQL store connection string overriding sql.dsn (no password)")
    _lease_wait(back)


def _bench_command(sub) -> None:
    sub.add_parser("bench", help="moved: python -m bench (development tooling, run from a checkout)", add_help=False)


def _runs_command(sub) -> None:
    runs = sub.add_parser(
        "runs", help="list the run ledger", description="List runs, backfill steps and cleanups from the ledger, newest first."
    )
    _common(runs)
    runs.add_argument("--source", help="only this source")
    runs.add_argument("--last", type=int, default=20, help="how many (default 20)")


def _cleanup_command(sub) -> None:
    clean = sub.add_parser(
        "cleanup",
        help="delete what no definition reads any more, and expired SQL rows",
        description="Clean one entity type in the configured stores. Redis: delete the fields of features that the ledger "
        "shows were written but that are no longer defined (and the freshness fields of removed sources); keys come from "
        "the tables and dates the ledger recorded for the steps that wrote them, not from a SCAN; a source whose keys "
        "cannot be found is reported, recorded as left and exits 1. SQL: walk the entity table in pages and delete rows "
        "past their expiry (the entity TTL) and rows of removed sources, and remove the JSON keys of removed features; "
        "run it as a role that may DELETE (fm_cleanup in conf/base/sql-grants.sql), e.g. --sql-dsn "
        "postgresql://fm_cleanup@db:26257/features --sql-password-env FM_SQL_CLEANUP_PASSWORD.",
    )
    _common(clean)
    clean.add_argument("--entity", required=True, help="entity type, e.g. consumer")
    clean.add_argument("--dry-run", action="store_true", help="print what would be deleted (the SQL table is read through); delete nothing")
    clean.add_argument(
        "--sink", choices=["redis", "cockroach", "all"], default="all", help="store(s) to clean (default: the configured sinks)"
    )
    clean.add_argument("--redis-url", help="Redis URL overriding the config")
    clean.add_argument("--sql-dsn", help="connection string of a role that may DELETE, overriding sql.dsn (no password in it)")
    clean.add_argument("--sql-password-env", help="env var holding that role's password, overriding sql.password_env")


def _verify_command(sub) -> None:
    ver = sub.add_parser(
        "verify",
        help="read a sample back from the stores and compare it with the source",
        description="Read a random sample (quality.verify_sample) of one date's entities back from every configured store, "
        "decode it and compare it with the source rows; writes nothing. Report: reports/<source>/<date>/verification.json.",
    )
    _common(ver)
    ver.add_argument("--date", required=True, type=_date, help="the snapshot date, YYYY-MM-DD; at most tomorrow (UTC)")
    ver.add_argument("--source", action="append", help="source to check; repeat for several (default: all configured)")
    _parallel(ver)
    ver.add_argument("--redis-url", help="Redis URL overriding the config")


def _schema_command(sub) -> None:
    schema = sub.add_parser(
        "schema",
        help="create (or check) the SQL store's entity tables, as a role that may create tables",
        description="The schema step: create each entity table the sources write when it is missing, bring a table made "
        "before the expires_at column up to the layout (and, on CockroachDB, set its row-level TTL), and check the "
        "columns of those that exist. The nightly run needs no right to create tables; run this under the owner role "
        "(conf/README.md 'Least privilege'), e.g. --sql-dsn postgresql://fm_schema@db:26257/features "
        "--sql-password-env FM_SQL_SCHEMA_PASSWORD.",
    )
    _common(schema)
    schema.add_argument(
        "--source", action="append", help="source whose entity table to create; repeat for several (default: all configured)"
    )
    schema.add_argument("--sql-dsn", help="connection string of the role that may create tables, overriding sql.dsn (no password in it)")
    schema.add_argument("--sql-password-env", help="env var holding that role's password, overriding sql.password_env")


def _ready_command(sub) -> None:
    ready = sub.add_parser(
        "ready",
        help="exit 0 when a source has rows for a date (for sensors)",
        description="Exit 0 when the source table has rows for --date (a long layout: rows of its defined feature names), "
        "3 when it has none yet.",
    )
    _common(ready)
    ready.add_argument("--date", required=True, type=_date)
    ready.add_argument("--source", required=True)


def _report_command(sub) -> None:
    rep = sub.add_parser(
        "report",
        help="print a run's summary from its report",
        description="Print the summary table of reports/<source>/<date>/summary.json (no Spark needed). "
        "A source run with --incremental has a report per run, named by its window's end "
        "(reports/<source>/<date>T<HHMMSS>Z/): without a report of the date itself, the last "
        "incremental run that ended on the date is printed, and the others named.",
    )
    _common(rep)
    rep.add_argument("--date", required=True, type=_date)
    rep.add_argument("--source", required=True)


def _sample_data_command(sub) -> None:
    sample = sub.add_parser(
        "sample-data",
        help="write the deterministic sample Delta tables",
        description="(Re)write the sample ETL tables consumer_daily and store_features_long.",
    )
    _common(sample)
    sample.add_argument("--days", type=int, default=5, help="number of dates (default 5)")
    sample.add_argument("--end", type=_date, default=dt.date(2026, 11, 20), help="last date (default 2026-11-20)")
    sample.add_argument("--consumers", type=int, default=2000, help="consumers per date (default 2000)")
    sample.add_argument("--stores", type=int, default=300, help="stores per date (default 300)")


def _get_command(sub) -> None:
    get = sub.add_parser(
        "get",
        help="read features as a model does; print Feast's response body",
        description="Read a Feast get-online-features request body (JSON: features or feature_service, entities, "
        "full_feature_names; from --request or stdin) and print the response body the feature server returns for it "
        "(results with values, statuses and event_timestamps; metadata.feature_names). No Spark needed.",
    )
    get.add_argument("--env", help="config env: conf/base + conf/<env> (default: $FM_ENV, else 'local')")
    get.add_argument("--request", metavar="FILE", help="the request body (default: stdin)")
    get.add_argument(
        "--store", choices=["redis", "sql"], help="read this store only (default: each source's stores from conf, Redis first)"
    )
    get.add_argument("--redis-url", help="another Redis than redis.url")
    get.add_argument("--pretty", action="store_true", help="indent the JSON (default: compact, as the server sends it)")


def _serve_command(sub) -> None:
    serve = sub.add_parser(
        "serve",
        help="serve features over HTTP: Feast's feature-server API",
        description="Serve POST /get-online-features (Feast's request and response bodies), GET /health and GET /metrics "
        "(Prometheus) on the asyncio reader of the env's conf and definitions. Stops on SIGTERM or Ctrl-C once the "
        "requests in flight are answered. Limits: server.* and reader.max_entities in conf. HTTPS: server.tls; bearer tokens: "
        "server.auth (off on a loopback address; on any other, serve refuses to start without it unless told so).",
    )
    serve.add_argument("--env", help="config env: conf/base + conf/<env> (default: $FM_ENV, else 'local')")
    serve.add_argument("--host", help="address to listen on (default: server.host, 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default: server.port, 6566 as Feast's)")
    serve.add_argument("--workers", type=int, default=1, help="server processes, each with its own reader and cache (default 1)")
    serve.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without authentication on a non-loopback address (refused otherwise unless server.auth.mode is set; "
        "e.g. behind a proxy that authenticates)",
    )


def _doctor_command(sub) -> None:
    doc = sub.add_parser(
        "doctor", help="check, without writing anything, that a deployment is ready to run",
        description="Read-only checks of everything a run needs: the Spark master (or Java and the Delta jars), each source's "
        "Delta table and its columns, the ledger, leases, quarantine and report locations, Redis (mode, cluster slots, memory "
        "headroom, eviction policy, listpack settings, the user's ACL) and SQL (dialect, tables, grants). One line per check, "
        "with what to fix; exit code 1 when any check fails.",
    )  # fmt: skip
    _common(doc)
    doc.add_argument("--source", action="append", help="only this source (repeatable; default: the run's sources)")
    doc.add_argument("--sink", choices=["redis", "cockroach", "all"], default="all", help="only this store (default: the configured sinks)")


def _defs_command(sub) -> None:
    defs = sub.add_parser(
        "defs",
        help="check the feature definitions and list field ids",
        description="Load and check feature_defs; print every feature with its type, options, stored name and field id. "
        "With --lock, record the definitions in feature_defs/stored.lock (what the stores hold under each stored name): "
        "new features, safe changes (int -> float, renames that keep their stored_as) and removals; a change that would "
        "make old values read differently is refused, one line per feature with the way forward.",
    )
    _common(defs)
    defs.add_argument("--source", help="only this source")
    defs.add_argument("--lock", action="store_true", help="write feature_defs/stored.lock from the definitions (commit it with them)")


def _import_feast_command(sub) -> None:
    imp = sub.add_parser(
        "import-feast",
        help="write definition files from a Feast repository (read by Feast's own code)",
        description="Read a Feast repository (the folder of its feature_store.yaml) with Feast's own code, run by the\n"
        "Python of your Feast environment in a fresh process (nothing is applied to Feast's registry or stores),\n"
        "and write its definitions: entities.yaml, one source per feature view under the view's name (so Feast's\n"
        "references such as driver_hourly_stats:conv_rate keep working), feature_services.yaml, stored.lock, and\n"
        "IMPORTED.md, which lists every choice and everything left out with the reason (printed here too).\n"
        "The files are checked as every command loads them before anything is written; importing again writes\n"
        "only what changed, and refuses a change of type that the stored values cannot follow. Point the job at\n"
        "the folder with definitions_dir in the env's config. The mapping: feature_defs/feast_import/README.md.",
        epilog="Examples:\n  materialize import-feast my_project/feature_repo\n"
        "  materialize import-feast ~/repos/features/feature_repo --out /srv/features/defs --feast-python ~/venvs/feast/bin/python",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    imp.add_argument("repo", metavar="REPO", help="the Feast repository: the folder of its feature_store.yaml")
    imp.add_argument(
        "--out", metavar="DIR", help="where to write the definitions (default: feast_defs/<project> under the working directory)"
    )
    imp.add_argument(
        "--feast-python", metavar="PY",
        help="the Python of your Feast environment (default: the one that runs the `feast` command on PATH)",
    )  # fmt: skip
    imp.add_argument(
        "--allow-missing-data", action="store_true",
        help="import even when a source path on this machine does not exist yet (each is listed); by default that stops the import",
    )  # fmt: skip
    imp.add_argument("--timeout", type=float, metavar="SECONDS", help="how long Feast may take to read the repository (default 300)")


def cmd_import_feast(args) -> int:
    from feature_defs.feast_import import DEFAULT_TIMEOUT, FeastImportError, import_feast, report

    timeout = DEFAULT_TIMEOUT if args.timeout is None else args.timeout  # 0 is refused, not the default
    try:
        done = import_feast(args.repo, args.out, args.feast_python, args.allow_missing_data, timeout)
    except FeastImportError as exc:
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(report(done)))
    return EXIT_OK


def _load(args, *, expectations: bool | None = False):
    """The conf and the definitions; with ``expectations`` (None: as the conf's gate says) the
    sources' own expectations are checked against great-expectations too (a slow import)."""
    from feature_defs import load_definitions
    from fm_config import load_config

    overrides: dict = {"data_root": args.data_root} if getattr(args, "data_root", None) else {}
    if getattr(args, "sink", "all") != "all":
        overrides["sinks"] = [args.sink]
    if getattr(args, "sql_dsn", None):
        overrides["sql"] = {"dsn": args.sql_dsn}
    if getattr(args, "sql_password_env", None):
        overrides.setdefault("sql", {})["password_env"] = args.sql_password_env
    if getattr(args, "redis_url", None):
        overrides["redis"] = {"url": args.redis_url}  # checked like the config's: no password in it
    if getattr(args, "parallel", None) is not None:
        overrides["parallel_sources"] = args.parallel
    if getattr(args, "wait_for_lease", None) is not None:
        overrides["lease"] = {"wait_seconds": args.wait_for_lease}
    conf = load_config(args.env, overrides)
    defs = load_definitions(conf.path(conf.definitions_dir), check_lock=not getattr(args, "lock", False))
    if expectations or (expectations is None and conf.quality.expectations):
        defs.check_expectations()
    return conf, defs


def cmd_defs(args) -> int:
    conf, defs = _load(args, expectations=True)
    if args.lock:
        from feature_defs import DEFAULT_DIR

        return _lock_defs(conf.path(conf.definitions_dir) or DEFAULT_DIR, defs)
    from serializers import field_id_int, freshness_field_name

    if defs.lock is None:
        print("warning: no feature_defs/stored.lock: changes of type or options cannot be checked; write it with `materialize defs --lock`")

    for source in defs.sources.values():
        if args.source and source.name != args.source:
            continue
        entity = defs.entity_of(source)
        print(
            f"{source.name}  (entity {entity.name}, key {entity.prefix}:<{':'.join(k.name for k in entity.keys)}>, layout {source.layout})"
        )
        print(f"  {freshness_field_name(source.name):<34} {'freshness':<12} field id {field_id_int(freshness_field_name(source.name)):>10}")
        for f in source.features:
            opts = ", ".join(f"{k}={v}" for k, v in f.options.items())
            stored = f"  stored as {f.stored_name}" if f.stored_as else ""
            print(f"  {f.name:<34} {f.type:<12} field id {f.field_id:>10}  {opts}{stored}")
    return EXIT_OK


def _lock_defs(directory, defs) -> int:
    """``defs --lock``: record what is lockable; refuse (writing nothing) what is not."""
    from feature_defs import DefinitionError
    from feature_defs.stored_lock import LOCK_NAME, changes, locked, write_lock

    found = changes(defs, defs.lock) if defs.lock else []
    refused = [c for c in found if not c.lockable]
    if refused:
        raise DefinitionError([c.line() for c in refused] + [f"nothing written to {directory / LOCK_NAME}"])
    lock = locked(defs, defs.lock)
    path = write_lock(directory, lock)
    for c in found:
        print(f"  {c.where}: {c.text}")
    names = sum(len(n) for n in lock.entities.values())
    print(f"{'wrote' if defs.lock is None else 'updated'} {path}: {names} stored names, {len(found)} change(s)")
    return EXIT_OK


def cmd_sample_data(args) -> int:
    from jobs.sample_data import sample_dates, write_sample_tables
    from jobs.spark import build_spark

    conf, defs = _load(args)
    spark = build_spark(conf.spark, conf.locations(defs))
    dates = sample_dates(args.days, args.end)
    counts = write_sample_tables(spark, conf.data_path, dates, args.consumers, args.stores)
    for table, rows in counts.items():
        print(f"wrote {rows:,} rows to {conf.data_path / table} ({dates[0]} .. {dates[-1]})")
    return EXIT_OK


def _each_source(args, action, report_name: str, setup=None, expectations: bool | None = False, select=None) -> int:
    """Run ``action(spark, conf, defs, name)`` per source, ``parallel_sources`` at a time in one
    Spark session (``setup(spark, conf)`` first); one failing does not stop the others.
    Each source's summary is printed when it ends, in the order they end. ``select(defs,
    names, named)``: the sources to run of those named (or configured, when not ``named``)."""
    from feature_defs import DefinitionError
    from jobs.operations.lease import LeaseHeld
    from jobs.pipeline.gate.checks import QualityGateError
    from jobs.pipeline.read import SourceNotReady
    from jobs.pipeline.report.stage import report_dir
    from jobs.pipeline.run import for_each_source
    from jobs.pipeline.source_table import check_catalog
    from jobs.spark import build_spark

    conf, defs = _load(args, expectations=expectations)
    names = args.source or conf.sources or list(defs.sources)
    check_catalog(conf, [defs.source(name) for name in names])  # unknown names, and tables without a catalog, fail before Spark starts
    if select:
        names = select(defs, names, bool(args.source))
    spark = build_spark(conf.spark, conf.locations(defs))
    if setup:
        setup(spark, conf)
    printing, errors, lost = threading.Lock(), {}, {}

    def done(name: str, summary, exc: Exception | None) -> None:
        report = report_dir(conf, name, args.date, name=getattr(args, "report_name", None)) / report_name
        errors[name] = exc
        lost[name] = getattr(summary, "store_loss", None)
        with printing:
            print(f"== {name} {getattr(args, 'covering', args.date)} (env {conf.env})", flush=True)
            if exc is None:
                print(f"{summary.table()}\nreport: {report}", flush=True)
            elif isinstance(exc, SourceNotReady):  # no rows for the date: nothing written, nothing recorded
                print(f"not ready: {name}: {exc}", file=sys.stderr, flush=True)
            else:
                print(f"error: {name}: {type(exc).__name__}: {exc}\nreport: {report}", file=sys.stderr, flush=True)

    for_each_source(names, lambda name: action(spark, conf, defs, name), conf.parallel_sources, done)
    store_lost = _store_lost([loss for name in names for loss in lost.get(name) or []])  # said even when a source failed
    failed = [name for name in names if errors.get(name) is not None]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        if all(isinstance(errors[name], LeaseHeld) for name in failed):
            return EXIT_LEASE_HELD
        if all(isinstance(errors[name], DefinitionError) for name in failed):
            return EXIT_USAGE  # definitions the stores cannot take: a retry cannot help
        if all(isinstance(errors[name], SourceNotReady) for name in failed):
            return EXIT_NOT_READY
        if all(isinstance(errors[name], QualityGateError) for name in failed):
            return EXIT_GATE_FAILED
        return EXIT_TERMINAL if all(retry_cannot_fix(errors[name]) for name in failed) else EXIT_FAILED
    return store_lost


def retry_cannot_fix(exc: BaseException) -> bool:
    """Whether running the same command again would fail the same way: definitions or a change
    the stores refuse, the gate, a source table not as defined, a store's terminal answer (full,
    refused TLS), a damaged ledger, the guard against older snapshots. A scheduler fails these
    at once (exit codes 2, 4 and 7) and retries the others."""
    from feature_defs import DefinitionError
    from jobs.operations.local_commits import DeltaLogError
    from jobs.pipeline.gate.checks import QualityGateError
    from jobs.pipeline.snapshot_order import MostlySkippedNewer
    from jobs.source_errors import SchemaDriftError
    from stores.errors import TerminalError

    return isinstance(exc, (DefinitionError, QualityGateError, TerminalError, SchemaDriftError, DeltaLogError, MostlySkippedNewer))


def _store_lost(losses: list[dict]) -> int:
    """Written, but a store had lost data written before: said last, on stderr, with the backfill."""
    for loss in losses:
        print(f"store lost data: {loss['sink']} at {loss['target']}: {loss['ranges']}: {loss['evidence']}", file=sys.stderr)
    for command in dict.fromkeys(loss["restore"] for loss in losses):
        print(f"restore it: {command}", file=sys.stderr)
    return EXIT_STORE_LOST if losses else EXIT_OK


def cmd_run(args) -> int:
    from jobs.operations.backfill import recorded_run
    from jobs.operations.ledger import Ledger
    from serializers.horizon import check_date, check_until

    until = select = None
    if args.incremental:
        from jobs.event_time import EventWindow, utc_text

        # the clock read once, for every source of the command (each records the end it covered)
        until = args.until or dt.datetime.now(dt.UTC).replace(microsecond=0)
        check_until(until)  # before Spark starts
        window = EventWindow(None, until, incremental=True)
        args.date, args.report_name, select = window.date, window.report_name, _incremental_sources
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
    return _each_source(
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


def _incremental_sources(defs, names: list[str], named: bool) -> list[str]:
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


def cmd_verify(args) -> int:
    from jobs.pipeline.run import verify_source
    from serializers.horizon import check_date

    check_date(args.date)
    return _each_source(
        args,
        lambda spark, conf, defs, name: verify_source(spark, conf, defs, name, args.date, redis_url=args.redis_url),
        "verification.json",
    )


def cmd_ready(args) -> int:
    from jobs.pipeline.read import partition_rows
    from jobs.pipeline.source_table import check_catalog
    from jobs.spark import build_spark

    conf, defs = _load(args)
    source = defs.source(args.source)
    check_catalog(conf, [source])
    if partition_rows(build_spark(conf.spark, conf.locations(defs)), conf, source, args.date):
        print(f"{source.name} has rows for {args.date}")
        return EXIT_OK
    print(f"{source.name} has no rows for {args.date} yet")
    return EXIT_NOT_READY


def cmd_report(args) -> int:
    from jobs.pipeline.report.stage import report_path
    from jobs.pipeline.report.summary import RunSummary, SummaryError

    conf, defs = _load(args)
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
    return _store_lost(summary.store_loss)


def cmd_backfill(args) -> int:
    from jobs.operations.backfill import BackfillError, plan_backfill, run_backfill, spans
    from jobs.operations.lease import LeaseHeld
    from jobs.operations.ledger import Ledger
    from jobs.pipeline.gate.checks import QualityGateError
    from jobs.pipeline.source_table import check_catalog
    from jobs.spark import build_spark
    from serializers.horizon import check_date

    check_date(args.end, "--end")  # before Spark starts
    conf, defs = _load(args, expectations=None)
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
    return _store_lost(summaries[-1].store_loss if summaries else [])


def bench_moved(rest: Sequence[str]) -> int:
    """The benchmarks are development tooling: not in the installed package, never imported by it."""
    command = " ".join(["python -m bench", *rest])
    print(
        f"error: the benchmarks moved out of the installed job: run `{command}` (or `make bench`) from a checkout of the project",
        file=sys.stderr,
    )
    return EXIT_USAGE


def cmd_runs(args) -> int:
    from jobs.event_time import cut_note
    from jobs.operations.ledger import Ledger, aware
    from jobs.spark import build_spark

    conf, defs = _load(args)
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


def cmd_cleanup(args) -> int:
    from jobs.operations.cleanup import CleanupPlan, plan_cleanup, recorded_cleanup
    from jobs.operations.cleanup_sql import clean_sql, plan_sql_cleanup
    from jobs.operations.ledger import Ledger
    from jobs.spark import build_spark

    conf, defs = _load(args)
    spark = build_spark(conf.spark, conf.locations(defs))
    ledger = Ledger.of(spark, conf)
    if "redis" in conf.sinks:
        plan, keys = plan_cleanup(spark, conf, defs, ledger, args.entity, args.redis_url)
    else:
        plan, keys = CleanupPlan(entity=defs.entity(args.entity).name), {}
    sql_plan = plan_sql_cleanup(conf, defs, args.entity) if "cockroach" in conf.sinks else None
    try:
        if plan.target:
            print(plan.describe(), flush=True)
            if not plan.parts:
                print("nothing to delete in Redis")
        if sql_plan is not None:
            print(sql_plan.describe(), flush=True)
        if args.dry_run:
            if sql_plan is not None:
                counted = clean_sql(conf, sql_plan, dry_run=True)
                print("\n".join(counted.describe()))
                if counted.error is not None:
                    print(f"error: SQL table {counted.table}: {' '.join(str(counted.error).split())}", file=sys.stderr)
                    return EXIT_FAILED
            print("dry run: nothing deleted")
            return EXIT_OK
        if not plan.parts and sql_plan is None:
            return EXIT_OK
        result = recorded_cleanup(conf, defs, ledger, plan, keys, args.redis_url, sql_plan)
    finally:
        for frame in keys.values():
            frame.unpersist()
    for source, done in {**result.cleaned, **result.left}.items():
        print(f"{source}: removed {done['fields_removed']:,} fields ({', '.join(done['fields'])}) from {done['keys']:,} keys")
    if result.memory_before is not None:
        print(f"removed {result.fields_removed:,} fields from {result.keys:,} keys in {result.seconds:.1f}s; "
              f"Redis memory {result.memory_before:,} -> {result.memory_after:,} B "
              f"(freed {max(0, result.memory_before - result.memory_after):,} B)")  # fmt: skip
    if result.sql is not None:
        print("\n".join(result.sql.describe()))
    for source, done in sorted(result.left.items()):
        print(
            f"error: not cleaned: {source} ({', '.join(done['fields'])}): {done['reason']}; recorded as left for a later cleanup",
            file=sys.stderr,
        )
    failed_sql = result.sql is not None and result.sql.error is not None
    if failed_sql:
        print(
            f"error: SQL table {result.sql.table}: {' '.join(str(result.sql.error).split())}; what was done is recorded, "
            "run the cleanup again to go on",
            file=sys.stderr,
        )
    return EXIT_FAILED if result.left or failed_sql else EXIT_OK


def cmd_schema(args) -> int:
    import psycopg

    from jobs.operations.schema import ensure_tables
    from stores.errors import MaterializerError

    conf, defs = _load(args)
    names = args.source or conf.sources or list(defs.sources)
    try:
        done = ensure_tables(conf, defs, names)
    except MaterializerError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)  # libpq puts its hints on lines of their own
        return EXIT_FAILED
    except psycopg.Error as exc:  # after connecting: the server went away, a timeout, a lock
        print(
            f"error: schema step on the SQL store ({conf.sql.dsn}) failed: [{exc.sqlstate or 'no SQLSTATE'}] {' '.join(str(exc).split())}",
            file=sys.stderr,
        )
        return EXIT_FAILED
    for table, state in done.items():
        print(f"{table}: {state}" + ("" if state == "created" else " (columns checked)"))
    return EXIT_OK


STORE_LABELS = {"redis": "Redis", "cockroach": "the SQL store"}


def cmd_get(args) -> int:
    import json

    from feature_reader import FeatureReader, RequestError, StoreError
    from feature_reader.feast_request import parse_body

    try:
        body = open(args.request, "rb").read() if args.request else sys.stdin.buffer.read()
    except OSError as exc:
        print(f"error: cannot read the request {args.request}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    conf, defs = _load(args)
    try:
        request = parse_body(body)
        with FeatureReader(conf, defs, cache=False, redis_url=args.redis_url) as reader:
            result = reader.get_online_features(**request, store=args.store)
            described = reader.descriptions
    except RequestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except StoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    for store, said in described.items():  # what the stores read hold against the definitions (serializers/FORMAT.md)
        for line in said["refused"]:
            print(f"note: INVALID: {line}", file=sys.stderr)
        if said["undescribed"]:
            print(f"note: {STORE_LABELS[store]} does not describe {', '.join(said['undescribed'])} yet (read as written)", file=sys.stderr)
    if args.pretty:
        print(json.dumps(result.to_feast(), indent=1, ensure_ascii=False))
    else:
        sys.stdout.buffer.write(result.to_feast_json() + b"\n")
    return EXIT_OK


def cmd_serve(args) -> int:
    from feature_push.app import APP
    from feature_reader.server import serve

    if args.workers < 1:
        print("error: --workers must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    serve(args.env, args.host, args.port, args.workers, args.insecure_no_auth, app=APP)
    return EXIT_OK


def cmd_doctor(args) -> int:
    from jobs.operations.doctor import run_checks

    conf, defs = _load(args)
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


def cmd_validate(args) -> int:
    from jobs.pipeline.run import validate_source
    from serializers.horizon import check_date

    check_date(args.date)
    return _each_source(
        args, lambda spark, conf, defs, name: validate_source(spark, conf, defs, name, args.date), "validation.json", expectations=True
    )


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return bench_moved(argv[1:])
    args = build_parser().parse_args(argv)
    from feature_defs import DefinitionError
    from feature_defs.loader import UnknownNameError
    from fm_config import ConfigError
    from jobs.operations.local_commits import DeltaLogError
    from jobs.source_errors import CatalogUnavailable, SchemaDriftError, SourceUnreadable
    from serializers.horizon import FutureDateError

    try:
        commands = {"run": cmd_run, "validate": cmd_validate, "verify": cmd_verify, "ready": cmd_ready, "report": cmd_report}
        commands |= {"backfill": cmd_backfill, "runs": cmd_runs, "cleanup": cmd_cleanup, "schema": cmd_schema, "doctor": cmd_doctor}
        commands |= {"get": cmd_get, "serve": cmd_serve, "sample-data": cmd_sample_data, "defs": cmd_defs, "import-feast": cmd_import_feast}
        return commands[args.command](args)
    except (ConfigError, DefinitionError, UnknownNameError, FileNotFoundError, FutureDateError, UsageError) as exc:
        # a KeyError of any other kind is a bug, not a usage error: its traceback is wanted
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (DeltaLogError, SchemaDriftError, SourceUnreadable, CatalogUnavailable) as exc:
        # a ledger's log a person has to look at (the message says what to do), a source table as
        # it is: one line each, no JVM trace; only an unreachable catalog is worth a retry
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_TERMINAL if retry_cannot_fix(exc) else EXIT_FAILED
    except ModuleNotFoundError as exc:
        # the base install reads features; Spark commands need [spark], `serve` needs [server]
        from jobs.extras import TITLES, install_hint, missing_extra

        missing = missing_extra(exc)
        if missing is None:
            raise  # not an extra's module: a broken install or a bug, its traceback is wanted
        module, extra = missing
        print(
            f"materialize {args.command} needs the {TITLES[extra]} extra ({module} is not installed): {install_hint(extra)}",
            file=sys.stderr,
        )
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
