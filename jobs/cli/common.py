"""What the commands share: argument types and flags, the conf and definitions they load, one
source after another in one Spark session, and which failures a retry cannot fix."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import threading

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


def date_arg(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {text!r}") from None


def instant_arg(text: str) -> dt.datetime:
    """An ISO 8601 time; UTC unless it says otherwise (2026-11-27T06:00:00Z, 2026-11-27T08:00:00+02:00, 2026-11-27)."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a time (ISO 8601, e.g. 2026-11-27T06:00:00Z): {text!r}") from None
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


class UsageError(ValueError):
    """Flags that do not fit together, or sources a command cannot run (exit code 2)."""


def common_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--env", help="config env: conf/base + conf/<env> (default: $FM_ENV, else 'local')")
    p.add_argument("--data-root", help="folder the sources' locations are under: Delta tables, Parquet files (overrides data_root)")


def lease_wait_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wait-for-lease", type=float, metavar="SECONDS",
        help="when another run is writing the same source and store, wait up to this long for it to end "
        "(default: lease.wait_seconds, 0: stop at once, exit code 5)",
    )  # fmt: skip


def parallel_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--parallel",
        type=int,
        metavar="N",
        help="sources worked on at once in the one Spark session (overrides parallel_sources, default 2)",
    )


def load(args, *, expectations: bool | None = False):
    """The conf and the definitions; with ``expectations`` (None: as the conf's gate says) the
    sources' own expectations are checked against great-expectations too (a slow import)."""
    from feature_defs import load_definitions
    from fm_config import load_config
    from fm_config.stores import store_name

    overrides: dict = {"data_root": args.data_root} if getattr(args, "data_root", None) else {}
    if getattr(args, "sink", "all") != "all":
        overrides["sinks"] = [store_name(args.sink, "--sink")]
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


def each_source(args, action, report_name: str, setup=None, expectations: bool | None = False, select=None) -> int:
    """Run ``action(spark, conf, defs, name)`` per source, ``parallel_sources`` at a time in one
    Spark session (``setup(spark, conf)`` first); one failing does not stop the others.
    Each source's summary is printed when it ends, in the order they end. ``select(defs,
    names, named)``: the sources to run of those named (or configured, when not ``named``)."""
    from feature_defs import DefinitionError
    from jobs.operations.ledger.lease import LeaseHeld
    from jobs.pipeline.gate.checks import QualityGateError
    from jobs.pipeline.read import SourceNotReady
    from jobs.pipeline.report.stage import report_dir
    from jobs.pipeline.run import for_each_source
    from jobs.pipeline.source_table import check_catalog
    from jobs.spark import build_spark

    conf, defs = load(args, expectations=expectations)
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
    lost_code = store_lost([loss for name in names for loss in lost.get(name) or []])  # said even when a source failed
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
    return lost_code


def retry_cannot_fix(exc: BaseException) -> bool:
    """Whether running the same command again would fail the same way: definitions or a change
    the stores refuse, the gate, a source table not as defined, a store's terminal answer (full,
    refused TLS), a damaged ledger, the guard against older snapshots. A scheduler fails these
    at once (exit codes 2, 4 and 7) and retries the others."""
    from feature_defs import DefinitionError
    from jobs.operations.ledger.local_commits import DeltaLogError
    from jobs.pipeline.gate.checks import QualityGateError
    from jobs.pipeline.snapshot_order import MostlySkippedNewer
    from jobs.source_errors import SchemaDriftError
    from stores.errors import TerminalError

    return isinstance(exc, (DefinitionError, QualityGateError, TerminalError, SchemaDriftError, DeltaLogError, MostlySkippedNewer))


def store_lost(losses: list[dict]) -> int:
    """Written, but a store had lost data written before: said last, on stderr, with the backfill."""
    for loss in losses:
        print(f"store lost data: {loss['sink']} at {loss['target']}: {loss['ranges']}: {loss['evidence']}", file=sys.stderr)
    for command in dict.fromkeys(loss["restore"] for loss in losses):
        print(f"restore it: {command}", file=sys.stderr)
    return EXIT_STORE_LOST if losses else EXIT_OK
