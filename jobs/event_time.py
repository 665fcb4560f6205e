"""Selection by event time (``select_by: event_time``), as ``feast materialize`` selects:
pure DataFrame-in/DataFrame-out steps applied to the source table once it is open.

A run covers a *window* of event times, ``[start, end)``: ``run --date D`` every row up to
the end of D (start open, end D+1 00:00 UTC); an incremental run from the end of the last
window the ledger recorded, less the source's lookback (jobs/operations/ledger/windows.py), up to
now or ``--until``. No window ends after the time the run reads the table (``read_at``): a
row whose event time is later may still be written (a ``--date`` of today, an ``--until``
ahead of the clock), so it is left to the next window rather than recorded as covered.
Of the window's rows each entity keeps its latest by event time, ties
broken by ``created_column`` (the latest wins), then as any exact tie is
(jobs/transforms.latest_per_key); its stored as-of time is that row's event time.

- Event time values: ``timestamp`` is an instant; ``timestamp_ntz`` and ``date`` are read in
  the job's session time zone, which the job pins to UTC (jobs/spark.py), as Feast reads a
  naive timestamp as UTC.
- Sub-seconds order the rows of an entity within a run; the stored as-of time is the event
  time floored to whole epoch seconds (the freshness field holds decimal seconds, and Feast's
  own SDK returns event timestamps as whole seconds too).
- A row with a null event time is bad input: quarantined with a reason naming the column,
  never written. A row whose event time is after the window's end is not part of it
  (a later window has it); no window ends beyond the horizon (serializers/horizon.py: the
  midnight after tomorrow, UTC), so an event time past it (2099: a unit or clock gone wrong)
  is never written, as no run takes a date past tomorrow.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from feature_defs import SourceDef
from jobs import transforms as tf
from jobs.sql_text import ident, literal

DEFAULT_LOOKBACK_SECONDS = 86_400
"""How late a row may arrive and still be loaded by the next incremental run, unless the
source's ``lookback_seconds`` says otherwise: one day."""


def lookback_seconds(source: SourceDef) -> int:
    return DEFAULT_LOOKBACK_SECONDS if source.lookback_seconds is None else source.lookback_seconds


def utc_text(when: dt.datetime) -> str:
    """2026-11-27T06:00:00Z (microseconds only when there are some)."""
    return when.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class EventWindow:
    """The event times a run covers: ``start`` (None: from the first row) inclusive, ``end`` exclusive, UTC."""

    start: dt.datetime | None
    end: dt.datetime
    incremental: bool = False
    """A run continued from the ledger (``run --incremental``), not a run of a date."""
    since: dt.datetime | None = None
    """Incremental: the end of the last window the ledger recorded (None: the source's first
    incremental run); ``start`` is this less the lookback."""
    requested_end: dt.datetime | None = None
    """The end asked for (``--date``'s or ``--until``'s) when it was later than the time the run
    read the table, which ``end`` is instead (None: not cut)."""

    def __post_init__(self) -> None:
        for when in (self.start, self.end, self.since, self.requested_end):
            if when is not None and when.utcoffset() != dt.timedelta(0):
                raise ValueError(f"an event-time window is in UTC: {when!r}")

    @property
    def date(self) -> dt.date:
        """The last date the window reaches into (its report and quarantine date)."""
        return end_date(self.end)

    @property
    def report_name(self) -> str | None:
        """An incremental run's report folder (a run of a date has its date's): the end, to the
        second, so two runs of a day keep their reports, and the row-count band (which compares
        runs of single dates) never takes one for a date's."""
        return (self.requested_end or self.end).strftime("%Y-%m-%dT%H%M%SZ") if self.incremental else None

    def read_at(self, when: dt.datetime) -> EventWindow:
        """This window as a run that reads the table at ``when`` covers it: ending no later
        (to the second, floored). Rows of a later event time may still be written, so the
        window that records them as covered is a later one."""
        when = when.astimezone(dt.UTC).replace(microsecond=0)
        return self if self.end <= when else replace(self, end=when, requested_end=self.requested_end or self.end)

    def describe(self, source: SourceDef) -> str:
        start = utc_text(self.start) if self.start else "the first row"
        text = f"{source.timestamp_column} from {start} to {utc_text(self.end)} (end excluded)"
        if self.incremental:
            if self.since is None:
                text += ": the source's first incremental run, everything up to its end"
            else:
                text += f": from the last window's end {utc_text(self.since)} less the lookback of {lookback_seconds(source):,} s"
        if self.requested_end is not None:
            text += f"; {cut_note(self.requested_end)}"
        return text


def cut_note(requested_end: dt.datetime) -> str:
    """Why a window ends before the end asked for (the summary's and `materialize runs`' words)."""
    return (
        f"cut at the time the run read the table: the end asked for, {utc_text(requested_end)}, was still to come, and rows "
        "with later event times may yet be written (the next incremental run reads them)"
    )


_run_read_time: dt.datetime | None = None
"""The one read time of the sources of a run under way (one_read_time), else None."""


def read_time(*, own: bool = False) -> dt.datetime:
    """The driver's clock, to the second (floored), as a run starts reading its table; inside
    ``one_read_time`` (unless ``own``), the time the run's sources started together."""
    if _run_read_time is not None and not own:
        return _run_read_time
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def cut_at_read(window: EventWindow) -> EventWindow:
    """``window`` as a run reading its table now covers it (EventWindow.read_at): at the run's
    one read time, or at this source's own clock when that would leave nothing of the window
    (the source waited for the lease of a run that read later)."""
    shared = read_time()
    cut = window.read_at(shared)
    if (cut.start is not None and cut.start >= cut.end) or (window.since is not None and window.since > shared):
        cut = window.read_at(read_time(own=True))
    return cut


@contextmanager
def one_read_time() -> Iterator[dt.datetime]:
    """The sources of one run read their tables as of one instant, taken before any of them
    reads (so no later than any of their reads): their windows are cut alike, and two sources
    over the same rows share one read and one prepared snapshot (jobs/pipeline/shared_cache.py)."""
    global _run_read_time
    if _run_read_time is not None:  # inside a run's: that one holds
        yield _run_read_time
        return
    _run_read_time = read_time(own=True)
    try:
        yield _run_read_time
    finally:
        _run_read_time = None


def end_date(end: dt.datetime) -> dt.date:
    """The last UTC date a window ending at ``end`` (excluded) reaches into."""
    return (end.astimezone(dt.UTC) - dt.timedelta(microseconds=1)).date()


def date_window(date: dt.date) -> EventWindow:
    """What ``run --date D`` covers: every row up to the end of D (D+1 00:00 UTC, excluded)."""
    return EventWindow(None, dt.datetime.combine(date + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC))


def day_window(date: dt.date) -> EventWindow:
    """The rows of one day (D 00:00 to D+1 00:00 UTC): when these exist, D is ready."""
    end = date_window(date).end
    return EventWindow(end - dt.timedelta(days=1), end)


# -- the transforms --


def _event_type(df: DataFrame, source: SourceDef) -> T.DataType:
    return df.schema[source.timestamp_column].dataType


def _instant(df: DataFrame, source: SourceDef) -> tuple[str, str]:
    """The event time as SQL text comparable with ``bound(micros)``: the column itself where
    its type allows (a filter Parquet and Delta can push down), else as a timestamp."""
    column = ident(source.timestamp_column)
    found = _event_type(df, source)
    if isinstance(found, T.TimestampNTZType):
        return column, "CAST(timestamp_micros({}) AS TIMESTAMP_NTZ)"
    if isinstance(found, T.TimestampType):
        return column, "timestamp_micros({})"
    return f"CAST({column} AS TIMESTAMP)", "timestamp_micros({})"


def _micros(when: dt.datetime) -> int:
    return (when - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1)


def in_window(df: DataFrame, source: SourceDef, window: EventWindow, *, keep_null: bool = True) -> DataFrame:
    """The rows whose event time is within ``window``; with ``keep_null``, also those with
    none (bad input, to quarantine: a filter would drop them unseen)."""
    column, bound = _instant(df, source)
    inside = f"{column} < {bound.format(_micros(window.end))}"
    if window.start is not None:
        inside = f"{column} >= {bound.format(_micros(window.start))} AND {inside}"
    return df.where(f"{ident(source.timestamp_column)} IS NULL OR ({inside})" if keep_null else inside)


def rows_in(df: DataFrame, source: SourceDef, window: EventWindow) -> int:
    """Whether any row has an event time within ``window``: 0 or 1, stops at the first."""
    return in_window(df, source, window, keep_null=False).limit(1).count()


def null_event_time_reason(source: SourceDef) -> str:
    """The reason names the column, not the source (the quarantine row and the summary do), so
    sources over the same rows tag them alike and share their prepared snapshot."""
    return f"null event time ({source.timestamp_column})"


def tag_null_event_time(df: DataFrame, source: SourceDef) -> DataFrame:
    """Add the reason of a row without an event time: it cannot be placed in any window or
    ordered against the entity's other rows, so it is bad input (quarantined, not written)."""
    reason = F.expr(f"CASE WHEN {ident(source.timestamp_column)} IS NULL THEN {literal(null_event_time_reason(source))} END")
    return tf.collect_reasons(df, [reason])


def event_seconds(df: DataFrame, source: SourceDef, unit: str = "seconds") -> Column:
    """The event time in whole UTC epoch seconds, floored (``unit`` "micros": microseconds)."""
    column = ident(source.timestamp_column)
    if not isinstance(_event_type(df, source), T.TimestampType):
        column = f"CAST({column} AS TIMESTAMP)"
    return F.expr(f"unix_{unit}({column})")


def with_event_as_of(df: DataFrame, source: SourceDef) -> DataFrame:
    """AS_OF per row: its event time (what the writers store as the entity's as-of time), and
    AS_OF_US, the same to the microsecond, by which the stores order writes (FORMAT.md 1.4)."""
    return df.withColumn(tf.AS_OF, event_seconds(df, source)).withColumn(tf.AS_OF_US, event_seconds(df, source, "micros"))


def null_event_time_note(source: SourceDef, bad_reasons: dict[str, int], quarantine_table: str) -> str | None:
    """The run's one line about rows without an event time, if it had any."""
    count = bad_reasons.get(null_event_time_reason(source), 0)
    if not count:
        return None
    where = f" in {quarantine_table}" if quarantine_table else ""
    return f"{count:,} row(s) of {source.name} have a null event time ({source.timestamp_column}): kept aside{where}, never written"


def no_rows(source: SourceDef, window: EventWindow, table: object, done: str) -> str:
    """Why a run of ``window`` is not ready: no row has an event time in it."""
    start = utc_text(window.start) if window.start else "the first row"
    # a date is ready once it has rows of its own; a table of older rows only (a Feast repository's sample data) is loaded whole so
    whole = (
        ""
        if window.incremental or window.start is None  # from the first row: no row at all, whatever the command
        else "; `materialize run --incremental` loads every row up to now whatever its date, as `feast materialize 1990-01-01T00:00:00 NOW`"
    )
    return (
        f"source {source.name!r} has no rows with an event time ({source.timestamp_column}) from {start} to {utc_text(window.end)} "
        f"(end excluded) in {table}: not ready; {done} (run it again once rows have arrived; `materialize ready` says when for a date"
        f"{whole})"
    )
