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
  is still loaded by ``run --date``, which reads every row up to the end of its date, or up
  to its read of the table when that is earlier).
  A lookback works on every table this job reads (Parquet files, Delta, catalog tables);
  selecting rows by what the table committed since the last run would need a commit history,
  which Parquet files and many catalog tables do not keep.
- The source's first incremental run (for a store) covers everything up to its end, and so
  does the first after a ``run --date`` of a later end: a run of a date records its window too
  (from the first row to the end of the date).
- No window ends after the time its run read the table (``read_window``): a ``--date`` of
  today or an ``--until`` still to come is cut there, and the cut recorded
  (``window_requested_end``), so rows written later with event times up to the end asked
  for are read by the next run. An end recorded by an older version later than the step's
  start counts as that start (``covered_to``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import SparkSession

from feature_defs import SourceDef
from fm_config import RunConf
from jobs.event_time import EventWindow, cut_at_read, lookback_seconds, no_rows, rows_in, utc_text
from jobs.operations.ledger.events import WRITE_KINDS, aware, on_target
from jobs.operations.ledger.store_state import date_ranges, restore_command
from jobs.pipeline.read import SourceNotReady
from jobs.pipeline.source_table import SourceNotFound, open_source, table_ref


def last_window_end(steps: Sequence[Mapping[str, Any]], source: str, sink: str, target: str) -> dt.datetime | None:
    """The latest window end that a succeeded write step of ``source`` recorded for this store."""
    ends = [
        covered_to(r)
        for r in steps
        if r["source"] == source
        and r["kind"] in WRITE_KINDS
        and r["status"] == "succeeded"
        and r.get("window_end") is not None
        and on_target(r, sink, target)
    ]
    latest = max(ends, default=None)
    return latest.to_pydatetime() if hasattr(latest, "to_pydatetime") else latest  # the ledger's reader may give pandas' Timestamp


def covered_to(step: Mapping[str, Any]) -> dt.datetime:
    """The end of the event times a step covered: its recorded ``window_end``, but no later than
    when it started (it read the table after that). Older versions recorded the end asked for,
    such as the midnight to come of a ``run --date`` of today, which the table could not yet hold."""
    end = aware(step["window_end"])
    started = step.get("started_at")
    return end if started is None else min(end, aware(started))


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
            f"end {utc_text(since)} less the lookback of {lookback_seconds(source):,} s): nothing to cover; the event times before "
            f"{utc_text(since)} are covered already: run without --until (up to now) or with a later one (a row later than the lookback "
            "is loaded by `materialize run --date D`, which covers every row up to the end of D or up to when it reads the table)"
        )
    return EventWindow(start, until, incremental=True, since=since)


def read_window(source: SourceDef, window: EventWindow, now: dt.datetime | None = None) -> EventWindow:
    """``window`` as a run reading the table at ``now`` (default: the clock) covers it: cut there
    when it would end later (EventWindow.read_at); WindowError when nothing is left of it."""
    cut = cut_at_read(window) if now is None else window.read_at(now)
    if cut.start is not None and cut.start >= cut.end:
        raise WindowError(
            f"source {source.name!r}: the window's start {utc_text(cut.start)} (the last window's end {utc_text(cut.since or cut.start)} "
            f"less the lookback of {lookback_seconds(source):,} s) is not before {utc_text(cut.end)}, when the run reads the table: "
            "nothing to cover yet; run it again later"
        )
    return cut


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
