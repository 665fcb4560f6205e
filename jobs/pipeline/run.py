"""The pipeline wired: read -> prepare -> quarantine -> gate -> write -> verify -> report,
for a run, a validation (no writes) and a verification (no writes) of one source."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pyspark.sql import SparkSession

from feature_defs import Definitions
from fm_config import RunConf
from jobs import event_time
from jobs.event_time import EventWindow, cut_at_read, date_window, no_rows, null_event_time_note
from jobs.pipeline.context import RunContext
from jobs.pipeline.describe import check_descriptions
from jobs.pipeline.gate import checks as quality
from jobs.pipeline.gate.stage import check_quality, docs_rendered
from jobs.pipeline.prepare import Prepared, prepare
from jobs.pipeline.quarantine import reason_counts, write_quarantine
from jobs.pipeline.read import SourceNotReady, ensure_ready, not_ready, read
from jobs.pipeline.report.stage import RecordedStep, new_summary, report_dir
from jobs.pipeline.report.summary import RunSummary
from jobs.pipeline.snapshot_order import check_mostly_newer
from jobs.pipeline.source_table import table_ref
from jobs.pipeline.verify import verify_sample, verify_writes
from jobs.pipeline.write_redis import write_redis
from jobs.pipeline.write_sql import prepare_sql, write_sql
from jobs.progress import progress
from serializers.horizon import check_date
from sinks.sql.preflight import dialect_of
from stores.sql import connect as sql_connect


def run_source(
    spark: SparkSession,
    conf: RunConf,
    defs: Definitions,
    source_name: str,
    date: dt.date,
    *,
    redis_url: str | None = None,
    report: bool = True,
    after_write: Callable[[RunSummary], None] | None = None,
    end: dt.date | None = None,
    guard_skipped_newer: bool = False,
    on_summary: Callable[[RunSummary], None] | None = None,
    window: EventWindow | None = None,
) -> RunSummary:
    """Materialize one source for one date; the summary is written even on failure.

    With ``end``, the dates ``date``..``end`` in one pass: each entity's latest good row
    (see :func:`prepare`). ``after_write`` runs between the writes and their verification
    (for integrations that want to act on a written snapshot, and for tests).
    ``guard_skipped_newer`` (a run, not a backfill step): fail when more than
    ``quality.max_skipped_newer`` of the entities held a newer snapshot (:mod:`snapshot_order`).
    A date past tomorrow (UTC) is refused before anything is read (FutureDateError).
    ``on_summary`` gets the new summary before anything runs (the ledger's findings about
    the stores). ``window``: a source selected by event time covers these event times
    (default: every row up to the end of ``date``; jobs/event_time.py).
    """
    check_date(end or date)
    source = defs.source(source_name)
    window = _window(source, date, end, window)
    if conf.quality.expectations:
        defs.check_expectations()  # before anything is written (once per definitions)
        quality.prefetch()
    shared = len(defs.sources_of(source.entity)) > 1  # the entity's SQL rows of other sources share its expiry
    ctx = RunContext(spark, conf, source, defs.entity_of(source), date, end, redis_url, shared_entity=shared, window=window)
    summary = new_summary(ctx, conf.env)
    if on_summary:
        on_summary(summary)
    report_file = report_dir(conf, source.name, date, end, name=window and window.report_name) / "summary.json"
    with RecordedStep(summary, report_file if report else None, "succeeded", conf.files) as step:
        step.prepared = prepared = _checked_snapshot(ctx, summary, quarantine=True)
        with ctx.stage(summary, "gate"):
            docs = check_quality(ctx, prepared, summary, expectations=conf.quality.expectations)
        try:  # the data docs render while the stores are written
            _write_and_verify(ctx, prepared, summary, after_write)
            if guard_skipped_newer:
                check_mostly_newer(ctx, summary)
        finally:
            if docs:
                with summary.stage("gate"):  # the gate's data docs: the wait for them, if any
                    docs_rendered(summary, docs)
    return summary


def _write_and_verify(ctx: RunContext, prepared: Prepared, summary: RunSummary, after_write: Callable[[RunSummary], None] | None) -> None:
    """Write the good rows to the stores, then (quality.verify_sample) read a sample of them
    back, taken before the write; ``after_write`` runs in between."""
    if ctx.conf.quality.verify_sample:  # the rows to read back, taken before the write (verify_sample)
        start = time.perf_counter()
        with ctx.stage(summary, "verify", timed=False):
            sample = verify_sample(ctx, prepared.good, summary)
        sampled = time.perf_counter() - start
    _write(ctx, prepared, summary)
    if after_write:
        after_write(summary)
    if ctx.conf.quality.verify_sample:
        try:
            with ctx.stage(summary, "verify"):
                verify_writes(ctx, sample, summary)
        finally:
            summary.stages["verify"] += sampled


def _window(source, date: dt.date, end: dt.date | None, window: EventWindow | None) -> EventWindow | None:
    """The event times a run of ``source`` covers (None: selected by date): no later than now,
    as it is about to read the table (EventWindow.read_at)."""
    if not source.by_event_time:
        if window is not None:
            raise ValueError(f"source {source.name!r} selects by date: a run of it covers a date, not an event-time window")
        return None
    if end is not None:
        raise ValueError(f"source {source.name!r} selects by event time: a run covers a window of event times, not a range of dates")
    return cut_at_read(window or date_window(date))


def _checked_snapshot(ctx: RunContext, summary: RunSummary, *, quarantine: bool) -> Prepared:
    """read -> prepare -> quarantine (or only count the reasons, for a run that writes nothing)."""
    with progress(ctx.spark, f"check {ctx.source.name}"):
        with ctx.stage(summary, "read"):
            raw = read(ctx)
        with ctx.stage(summary, "prepare"):
            prepared = prepare(ctx, raw)
        try:
            _quarantine(ctx, summary, prepared, quarantine=quarantine)
        except BaseException:
            prepared.release()  # the caller never gets it: released here, or another source's frames stay cached
            raise
    return prepared


def _quarantine(ctx: RunContext, summary: RunSummary, prepared: Prepared, *, quarantine: bool) -> None:
    summary.record(prepared.counts)
    if not prepared.counts.snapshot_entities:  # no rows: not a success of 0 entities
        if ctx.window is not None:
            raise SourceNotReady(no_rows(ctx.source, ctx.window, table_ref(ctx.conf, ctx.source), "nothing was written"))
        raise not_ready(ctx.conf, ctx.source, ctx.date, ctx.end, done="nothing was written")
    with ctx.stage(summary, "quarantine"):
        bad = prepared.counts.bad_rows
        if quarantine:
            summary.quarantine_table = write_quarantine(ctx, prepared.quarantine, bad)
        summary.bad_reasons = reason_counts(prepared.quarantine, bad)
    if ctx.window is not None and (note := null_event_time_note(ctx.source, summary.bad_reasons, summary.quarantine_table)):
        summary.warnings.append(note)


# Sources run at once in one process (materialize run's parallel_sources) take turns writing:
# a store's capacity check before a write then sees no other write of this run under way.
_STORE_WRITES = threading.Lock()


def for_each_source(
    names: list[str], work: Callable[[str], Any], parallel: int, done: Callable[[str, Any, Exception | None], None]
) -> None:
    """``work(name)`` for every source, ``parallel`` at a time (threads sharing the one Spark
    session: one source's driver work, planning, great-expectations, overlaps another's
    Spark jobs); ``done(name, result, error)`` as each ends. One failing stops no other."""

    def one(name: str) -> None:
        try:
            result = work(name)
        except Exception as exc:
            done(name, None, exc)
        else:
            done(name, result, None)

    with event_time.one_read_time(), ThreadPoolExecutor(max_workers=max(1, min(parallel, len(names))), thread_name_prefix="source") as pool:
        list(pool.map(one, names))


def _write(ctx: RunContext, prepared: Prepared, summary: RunSummary) -> None:
    """Every configured store; the SQL store's checks run before either store is written."""
    if not _STORE_WRITES.acquire(blocking=False):
        with summary.stage("wait for stores"):  # another source of this run is writing
            _STORE_WRITES.acquire()
    try:
        _write_stores(ctx, prepared, summary)
    finally:
        _STORE_WRITES.release()


def _write_stores(ctx: RunContext, prepared: Prepared, summary: RunSummary) -> None:
    sql_sink = None
    if "sql" in ctx.conf.sinks:
        with ctx.stage(summary, "sql checks"):
            sql_sink = prepare_sql(ctx, summary)
    described = check_descriptions(ctx, sql_sink)  # both stores' before either is written
    if "redis" in ctx.conf.sinks:
        with ctx.stage(summary, "write redis"):
            write_redis(ctx, prepared.good, summary, described["redis"])
    if sql_sink:
        with ctx.stage(summary, "write sql"):
            write_sql(ctx, sql_sink, prepared.sql_good, summary, described["sql"])


def validate_source(spark: SparkSession, conf: RunConf, defs: Definitions, source_name: str, date: dt.date) -> RunSummary:
    """The checks of a run without any write: status 'passed' or 'failed', report in validation.json."""
    check_date(date)
    source = defs.source(source_name)
    defs.check_expectations()
    ensure_ready(spark, conf, source, date)  # no rows: not ready, and no report to say "passed" or "failed"
    ctx = RunContext(spark, conf, source, defs.entity_of(source), date, window=_window(source, date, None, None))
    summary = new_summary(ctx, conf.env)
    with RecordedStep(summary, report_dir(conf, source.name, date) / "validation.json", "passed", conf.files) as step:
        step.prepared = prepared = _checked_snapshot(ctx, summary, quarantine=False)
        with ctx.stage(summary, "gate"):
            docs_rendered(summary, check_quality(ctx, prepared, summary, expectations=True, docs_folder="validate_docs"))
    return summary


def verify_source(
    spark: SparkSession, conf: RunConf, defs: Definitions, source_name: str, date: dt.date, *, redis_url: str | None = None
) -> RunSummary:
    """Read back a sample of the date's snapshot from every configured store and compare it
    with the source rows (what a run does after writing), without writing; verification.json."""
    check_date(date)
    source = defs.source(source_name)
    ctx = RunContext(spark, conf, source, defs.entity_of(source), date, redis_url=redis_url, window=_window(source, date, None, None))
    summary = new_summary(ctx, conf.env)
    with RecordedStep(summary, report_dir(conf, source.name, date) / "verification.json", "verified", conf.files) as step:
        with progress(spark, f"read {source.name}"), ctx.stage(summary, "prepare"):
            step.prepared = prepared = prepare(ctx, read(ctx))
        summary.record(prepared.counts)
        if "redis" in conf.sinks:
            summary.sinks["redis"] = {}
        if "sql" in conf.sinks:
            with sql_connect(ctx.sql_config()) as conn:
                summary.sinks["sql"] = {"dialect": dialect_of(conf.sql, conn)}
        with ctx.stage(summary, "verify"):
            verify_writes(ctx, verify_sample(ctx, prepared.good, summary), summary)
    return summary
