"""The ledger's event-time windows: where an incremental run (``materialize run --incremental``)
of a source selected by event time starts.

Feast's ``materialize-incremental`` keeps one watermark per feature view, in event time, and
moves it before it knows the write succeeded: a row that arrives late (its event time inside
a window already materialized) is never loaded, and a window whose run crashed is never run
again. Here:

- The window only advances through the ledger: a run records the window it covered
  (``window_start``, ``window_end``) with its outcome, and an incremental run continues from
  the latest end that a *succeeded* step recorded. A failed or crashed run (left ``running``)
  records nothing that counts, so the next run covers its window again; the stores take the
  repeat (an equal as-of time is written again, an older one never replaces a newer one).
- Per store: the start is the earliest of the latest ends recorded for each store this run
  writes (a run with ``--sink redis`` covers nothing for the SQL store).
- Late rows: the window starts ``lookback_seconds`` (default one day) before that end, so a
  row arriving up to that late is loaded by the next run. A row later than that is not (it
  is still loaded by ``run --date``, which reads every row up to the end of its date).
  A lookback works on every table this job reads (Parquet files, Delta, catalog tables);
  selecting rows by what the table committed since the last run would need a commit history,
  which Parquet files and many catalog tables do not keep.
- The source's first incremental run (for a store) covers everything up to its end, and so
  does the first after a ``run --date`` of a later end: a run of a date records its window too
  (from the first row to the end of the date).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import SparkSession

from feature_defs import SourceDef
from fm_config import RunConf
from jobs.event_time import EventWindow, lookback_seconds, no_rows, rows_in, utc_text
from jobs.operations.ledger import WRITE_KINDS, aware, on_target
from jobs.operations.store_state import date_ranges, restore_command
from jobs.pipeline.read import SourceNotReady
from jobs.pipeline.source_table import SourceNotFound, open_source, table_ref


def last_window_end(steps: Sequence[Mapping[str, Any]], source: str, sink: str, target: str) -> dt.datetime | None:
    """The latest window end that a succeeded write step of ``source`` recorded for this store."""
    ends = [
        aware(r["window_end"])
        for r in steps
        if r["source"] == source
        and r["kind"] in WRITE_KINDS
        and r["status"] == "succeeded"
        and r.get("window_end") is not None
        and on_target(r, sink, target)
    ]
    latest = max(ends, default=None)
    return latest.to_pydatetime() if hasattr(latest, "to_pydatetime") else latest  # the ledger's reader may give pandas' Timestamp


def incremental_window(
    source: SourceDef, steps: Sequence[Mapping[str, Any]], targets: Mapping[str, str], until: dt.datetime
) -> EventWindow:
    """The window an incremental run of ``source`` into ``targets`` (sink -> target) covers, up to ``until``."""
    ends = [last_window_end(steps, source.name, sink, target) for sink, target in sorted(targets.items())]
    if not ends or any(end is None for end in ends):
        return EventWindow(None, until, incremental=True)
    since = min(ends)
    start = since - dt.timedelta(seconds=lookback_seconds(source))
    if start >= until:
        raise WindowError(
            f"source {source.name!r}: --until {utc_text(until)} is not after the window's start {utc_text(start)} (the last window's "
            f"end {utc_text(since)} less the lookback of {lookback_seconds(source):,} s): nothing to cover; "
            "`materialize run --date D` writes each entity's latest row up to the end of D"
        )
    return EventWindow(start, until, incremental=True, since=since)


class WindowError(ValueError):
    """An incremental run whose end is not after where it would start."""


def ensure_window_ready(spark: SparkSession, conf: RunConf, source: SourceDef, window: EventWindow) -> None:
    """Raise SourceNotReady (exit code 3, nothing recorded) unless a row has an event time in
    ``window``. A table that is not there is left to the run's read, which names it."""
    try:
        raw = open_source(spark, conf, source)
    except SourceNotFound:
        return
    if not rows_in(raw, source, window):
        raise SourceNotReady(no_rows(source, window, table_ref(conf, source), "nothing was written or recorded"))


def event_time_losses(
    losses: list[dict], through: dt.date | None, env: str, source: str, all_sinks: list[str], redis_url: str | None = None
) -> tuple[list[dict], list[dt.date]]:
    """A store's losses (store_state.outstanding) as a source selected by event time sees them.

    A run of a date ``through`` writes each entity's latest row up to its end, so every date
    lost until then is written again: those are returned, for the ledger to count them written
    (an incremental run, ``through`` None, rewrites only its window). What is left is restored
    by a run of its latest date, not by a backfill, which such a source refuses."""
    covered: set[dt.date] = set()
    left = []
    for loss in losses:
        days = [dt.date.fromisoformat(d) for d in loss["dates"]]
        if through is not None:
            covered |= {d for d in days if d <= through}
            days = [d for d in days if d > through]
        if days:
            left.append({**loss, "dates": [d.isoformat() for d in days], "ranges": date_ranges(days)})
    if left:
        dates, sinks = [d for loss in left for d in loss["dates"]], [loss["sink"] for loss in left]
        command = restore_command(env, source, dates, sinks, all_sinks, redis_url, by_event_time=True)
        for loss in left:
            loss["restore"] = command
    return left, sorted(covered)
