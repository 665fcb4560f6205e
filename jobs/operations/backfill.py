"""Backfills: repair missed nights or load a feature's history, with the ledger's help.

``latest`` (default) writes, in one pass over the range, each entity's latest good row
(one write per entity, the state that applying the dates in order leaves); ``replay``
runs the dates one by one, in order. Dates a succeeded step already wrote to the same
sinks are skipped unless forced, so a failed backfill resumes where it stopped.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
import time
from contextlib import closing
from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from feature_defs import DefinitionError, Definitions
from fm_config import RunConf
from jobs import transforms as tf
from jobs.event_time import date_window
from jobs.operations.ledger.events import Entry, Ledger, config_hash, keys_from, sink_targets
from jobs.operations.ledger.store_state import Finding, check_stores, date_ranges, outstanding
from jobs.operations.ledger.windows import ensure_window_ready, event_time_losses, incremental_window, read_window
from jobs.operations.written_as import written_as_problems
from jobs.pipeline.read import ensure_ready, source_rows
from jobs.pipeline.report.summary import RunSummary
from jobs.pipeline.run import run_source
from jobs.pipeline.source_table import dated, open_source
from serializers.horizon import check_date, check_until, latest_date

Mode = Literal["latest", "replay"]
log = logging.getLogger(__name__)


class BackfillError(RuntimeError):
    pass


@dataclass
class Plan:
    source: str
    start: dt.date
    end: dt.date
    mode: Mode
    sinks: list[str]
    dates_with_data: list[dt.date]
    """Dates with rows from --start to the later of --end and the last date already written."""
    already_written: list[dt.date]
    to_write: list[dt.date]
    reapply: list[dt.date] = field(default_factory=list)
    """Dates already written after the first date to write: applied again, in order, so no entity ends older."""
    fewer_features: dict[dt.date, list[str]] = field(default_factory=dict)
    """Already-written dates that lack some of today's features (written with older definitions)."""
    rows: int = 0
    """Rows of the source in the dates of the steps."""
    feature_bytes: int = 0
    """Estimated bytes of feature values those rows carry (JSON size of a sample)."""
    running: list[dict] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    """What the ledger says the stores cannot take of today's definitions: every step would be refused."""
    lost: list[Finding] = field(default_factory=list)
    """Stores that lost dates the ledger shows written to them (those dates are to write again)."""
    unchecked: str | None = None
    """Why the stores could not be compared with the ledger, if they could not."""
    no_rows: list[dt.date] = field(default_factory=list)
    """Dates of --start..--end without rows: not ready, skipped (a later backfill writes them once they have rows)."""

    @property
    def steps(self) -> list[tuple[dt.date, dt.date | None]]:
        """(date, end) per run_source call: one range for latest, one date each for replay."""
        if not self.to_write:
            return []
        if self.mode == "replay":
            return [(d, None) for d in sorted(set(self.to_write) | set(self.reapply))]
        return [(self.to_write[0], self.dates_with_data[-1])]

    def dates_of(self, start: dt.date, end: dt.date | None) -> list[dt.date]:
        return [d for d in self.dates_with_data if start <= d <= (end or start)]

    def describe(self) -> str:
        fmt = lambda ds: ", ".join(d.isoformat() for d in ds) or "none"  # noqa: E731
        in_range = [d for d in self.dates_with_data if d <= self.end]
        lines = [
            f"backfill {self.source} {self.start}..{self.end} mode {self.mode} into {', '.join(self.sinks)}",
            f"  dates with data:  {fmt(in_range)}",
            f"  already written:  {fmt(self.already_written)} (skipped; --force writes them again)",
            f"  to write:         {fmt(self.to_write)}",
        ]
        if self.no_rows:
            lines.append(f"  no rows:          {spans(self.no_rows)} (not ready: skipped; written by a backfill once they have rows)")
        if self.reapply:
            lines.append(f"  applied again:    {fmt(self.reapply)} (already written, later than a date to write: keeps the order)")
        for f in self.lost:
            lines.append(f"  lost:             {date_ranges(f.lost)} ({f.sink} at {f.target} no longer holds them: {f.evidence})")
        if self.unchecked:
            lines.append(f"  note: the stores could not be compared with the ledger ({self.unchecked}); each step compares before writing")
        for day, missing in sorted(self.fewer_features.items()):
            lines.append(f"  note: {day} was written without {', '.join(missing)} (older definitions): --force writes it with today's")
        if self.to_write:
            steps = ", ".join(f"{a}..{b}" if b else str(a) for a, b in self.steps)
            lines.append(f"  steps:            {steps}")
            lines.append(f"  estimated:        {self.rows:,} rows read, about {self.feature_bytes:,} bytes of feature values")
        for problem in self.refused:
            lines.append(f"  refused: {problem}")
        for r in self.running:
            lines.append(
                f"  note: step {r['run_id'][:8]} ({r['kind']} {r['start_date']}..{r['end_date']}) "
                f"is still marked running since {r['started_at']}: live elsewhere, or it crashed"
            )
        return "\n".join(lines)


def plan_backfill(
    spark: SparkSession,
    conf: RunConf,
    defs: Definitions,
    ledger: Ledger,
    source_name: str,
    start: dt.date,
    end: dt.date,
    mode: Mode,
    force: bool,
    redis_url: str | None = None,
) -> Plan:
    if end < start:
        raise BackfillError(f"--end {end} is before --start {start}")
    check_date(end, "--end")
    source = defs.source(source_name)
    if source.by_event_time:
        raise BackfillError(
            f"source {source.name!r} selects by event time (select_by: event_time): a backfill applies the dates of a date column. "
            f"`materialize run --date {end} --source {source.name}` writes each entity's latest row up to the end of {end}, "
            "from its whole history; `materialize run --incremental` continues from the last window the ledger recorded"
        )
    # a date past the latest accepted (a typo the ledger recorded before runs refused it) is
    # never applied again: the stores treat its as-of time as corrupt
    latest = latest_date()
    steps = ledger.source_steps(source.name)
    written = {d: names for d, names in ledger.written_dates(source.name, sink_targets(conf, redis_url), steps).items() if d <= latest}
    try:  # a store that lost what the ledger says it holds: its dates are not written (ledger/store_state.py)
        findings, unchecked = [f for f in check_stores(conf, defs, source.name, steps, redis_url) if f.lost], None
    except Exception as exc:  # noqa: BLE001 (the plan stands without it; the steps compare again before writing)
        findings, unchecked = [], f"{type(exc).__name__}: {exc}"
    lost_now = {d for f in findings for d in f.found_now}
    written = {d: names for d, names in written.items() if d not in lost_now}
    done = set() if force else set(written)
    horizon = max([end, *written])
    raw = open_source(spark, conf, source)
    day = tf.col(source.date_column)
    in_range = dated(raw, source.date_column, start, horizon, source=source.name)
    present = sorted(r[0] for r in source_rows(in_range, source).select(day).distinct().collect())  # dates: `dated` checked the column
    to_write = [d for d in present if d <= end and d not in done]
    current = {f.stored_name for f in source.features}
    plan = Plan(
        source=source.name, start=start, end=end, mode=mode, sinks=list(conf.sinks), dates_with_data=present,
        already_written=[d for d in present if d <= end and d in done], to_write=to_write,
        reapply=[d for d in present if to_write and d > to_write[0] and d in done],
        fewer_features={d: sorted(current - written[d]) for d in present if d in done and current - written[d]},
        running=[r for r in steps if r["status"] == "running"], lost=findings, unchecked=unchecked,
        refused=written_as_problems(source, ledger.write_steps(source.entity)),
        no_rows=sorted(set(days(start, end)) - set(present)),
    )  # fmt: skip
    if plan.to_write:
        step_dates = sorted({d for s, e in plan.steps for d in plan.dates_of(s, e)})
        rows = in_range.where(day.isin(step_dates))
        columns = [f.source_column for f in source.features] if source.layout == "wide" else [source.value_column]
        stats = rows.agg(
            F.count(F.lit(1)).alias("n"), F.avg(F.length(F.to_json(F.struct(*[tf.col(c) for c in columns])))).alias("avg")
        ).first()
        plan.rows = stats["n"]
        plan.feature_bytes = int((stats["avg"] or 0) * plan.rows)
    return plan


def days(start: dt.date, end: dt.date) -> list[dt.date]:
    return [start + dt.timedelta(days=n) for n in range((end - start).days + 1)]


def spans(dates: list[dt.date]) -> str:
    """Sorted dates with runs of consecutive days shortened: 2026-11-16..2026-11-18, 2026-11-20."""
    runs: list[list[dt.date]] = []
    for d in dates:
        if runs and d - runs[-1][-1] == dt.timedelta(days=1):
            runs[-1].append(d)
        else:
            runs.append([d])
    return ", ".join(f"{r[0]}..{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


class Progress:
    """A bar with counts and ETA on a terminal; plain lines otherwise (logs, CI, Airflow)."""

    def __init__(self, total: int, label: str):
        self.total, self.label, self.done = total, label, 0
        self.start = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=label, unit="step", file=sys.stderr)

    def step(self, text: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_postfix_str(text)
            self.bar.update(1)
            return
        elapsed = time.monotonic() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        print(f"[{self.label}] {self.done}/{self.total} {text}; elapsed {elapsed:.0f}s, ETA {eta:.0f}s", flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def recorded_run(
    spark: SparkSession,
    conf: RunConf,
    defs: Definitions,
    ledger: Ledger,
    kind: str,
    source_name: str,
    start: dt.date,
    end: dt.date | None = None,
    *,
    dates: list[dt.date] | None = None,
    writing: list[dt.date] | None = None,
    until: dt.datetime | None = None,
    **run_kwargs,
) -> RunSummary:
    """run_source with a ledger entry: 'running' before, 'succeeded'/'failed' after.

    ``dates``: the dates with data the step covers (default: ``start``). Before writing, the
    stores are compared with what the ledger recorded (ledger/store_state.py): a loss found is
    recorded with the step, and the summary names the losses that ``writing`` (the dates
    the whole command writes; default ``dates``) leaves, with the backfill that restores them.

    ``until`` (a source selected by event time): an incremental run, from the last window the
    ledger recorded (less the lookback) up to ``until`` (jobs/operations/ledger/windows.py); ``start``
    is then its report's date. A source selected by event time records its window either way."""
    source = defs.source(source_name)
    targets = sink_targets(conf, run_kwargs.get("redis_url"))
    window = _date_window(spark, conf, source, start, end, until)
    # one writer per (source, store): taken before anything is recorded or written
    with ledger.leases(conf.lease.seconds).hold(source.name, sorted(targets.values()), kind, wait=conf.lease.wait_seconds):
        if until is not None:  # read under the lease: no other run of the source ends meanwhile
            check_until(until)
            window = incremental_window(source, ledger.source_steps(source.name), targets, until)
        if window is not None:  # ends no later than now, before the table is read: later rows may yet arrive
            window = read_window(source, window)
        if until is not None or (window is not None and window.requested_end is not None):  # a date's rows may all be to come
            ensure_window_ready(spark, conf, source, window)
        problems = written_as_problems(source, ledger.write_steps(source.entity))
        if problems:
            raise DefinitionError(problems)  # nothing recorded, nothing written
        entry = _entry(conf, defs, source, kind, start, end, targets, window)
        losses, notes, rewritten = _losses(conf, defs, ledger, entry, writing or dates or [start], None if until else start, run_kwargs)
        ledger.start(entry)  # with the stores as found, and any loss: recorded even if the step dies

        def note(summary: RunSummary) -> None:
            summary.store_loss, summary.warnings[:0] = losses, notes

        try:
            summary = run_source(spark, conf, defs, source.name, start, end=end, on_summary=note, window=window, **run_kwargs)
        except BaseException as exc:
            try:
                ledger.finish(entry, error=exc)
            except Exception as ledger_exc:  # never hide the run's own error
                log.error("could not record the failure of %s in the ledger: %s", entry.run_id, ledger_exc)
            raise
        entry.dates = (dates if dates is not None else [start]) if summary.rows_read else []
        if entry.dates and rewritten:  # the dates a loss took, written again by this run
            entry.dates = sorted({*entry.dates, *rewritten})
        ledger.finish(entry, summary)
    return summary


def _losses(conf: RunConf, defs: Definitions, ledger: Ledger, entry: Entry, writing: list[dt.date], through: dt.date | None, run_kwargs):
    """What the stores lost of what the ledger says they hold (with the warnings naming the
    backfill that restores it), and the dates this run writes again; ``through``: a run of
    a date (None: an incremental run)."""
    redis_url = run_kwargs.get("redis_url")
    losses, notes = _check_stores(conf, defs, ledger, entry, writing, redis_url)
    rewritten: list[dt.date] = []
    if defs.source(entry.source).by_event_time:  # a run of a date rewrites every row up to its end; restored by such a run
        losses, rewritten = event_time_losses(losses, through, conf.env, entry.source, list(conf.sinks), redis_url)
    return losses, notes, rewritten


def _date_window(spark: SparkSession, conf: RunConf, source, start: dt.date, end: dt.date | None, until: dt.datetime | None):
    """A run of a date (``until`` None): the date checked and ready before anything is recorded,
    and its event-time window when the source selects by event time."""
    if until is not None:
        if not source.by_event_time:
            raise ValueError(f"source {source.name!r} selects by date (select_by: date): run a date of it, not an incremental window")
        return None
    check_date(end or start)  # a date past tomorrow: refused before the table is read, nothing recorded (as run_source does)
    window = date_window(start) if source.by_event_time else None
    ensure_ready(spark, conf, source, start, end)  # a date without rows is not ready: nothing recorded
    return window


def _entry(conf: RunConf, defs: Definitions, source, kind: str, start: dt.date, end: dt.date | None, targets: dict, window) -> Entry:
    """The step's ledger entry, as recorded when it starts."""
    return Entry(
        kind=kind, source=source.name, entity=source.entity, start_date=start, end_date=end or start, sinks=list(conf.sinks),
        definitions_hash=defs.digest, config_hash=config_hash(conf), features=[f.stored_name for f in source.features],
        encodings={f.stored_name: f.encoding for f in source.features},
        targets=targets, keys_from=keys_from(conf, source, defs.entity_of(source)),
        window_start=window and window.start, window_end=window and window.end,
        window_requested_end=window and window.requested_end,
    )  # fmt: skip


def _check_stores(
    conf: RunConf, defs: Definitions, ledger: Ledger, entry: Entry, writing: list[dt.date], redis_url: str | None
) -> tuple[list[dict], list[str]]:
    """The stores against the ledger, before a step writes: fills ``entry.stores`` (what was
    found, and a loss); returns the losses left after ``writing`` and warnings. A store that
    cannot be asked is a warning here: the write itself says what is wrong with it."""
    try:
        findings = check_stores(conf, defs, entry.source, ledger.source_steps(entry.source), redis_url)
    except Exception as exc:  # noqa: BLE001 (a check that could not finish must not stop the write)
        log.warning("could not compare the stores with the ledger: %s", exc)
        return [], [f"could not compare the stores with what the ledger recorded: {type(exc).__name__}: {exc}"]
    for f in findings:
        if f.seen is not None:
            entry.stores.setdefault(f.sink, {})["before"] = f.seen
        if f.found_now:
            entry.stores.setdefault(f.sink, {})["lost"] = f.recorded()
            log.error("%s", f.text())
    losses = outstanding(findings, writing, conf.env, list(conf.sinks), redis_url)
    return losses, [f.warning for f in findings if f.warning]


def run_backfill(spark: SparkSession, conf: RunConf, defs: Definitions, ledger: Ledger, plan: Plan, **run_kwargs) -> list[RunSummary]:
    """Run the plan's steps in order, each recorded in the ledger; stop at the first failure."""
    summaries: list[RunSummary] = []
    targets = sorted(sink_targets(conf, run_kwargs.get("redis_url")).values())
    progress = Progress(len(plan.steps), f"backfill {plan.source}")
    writing = sorted({d for s, e in plan.steps for d in plan.dates_of(s, e)})
    # the lease is held across the steps: no other run writes the source between two of them
    with (
        ledger.leases(conf.lease.seconds).hold(plan.source, targets, f"backfill-{plan.mode}", wait=conf.lease.wait_seconds),
        closing(progress),
    ):
        for start, end in plan.steps:
            try:
                summary = recorded_run(
                    spark,
                    conf,
                    defs,
                    ledger,
                    f"backfill-{plan.mode}",
                    plan.source,
                    start,
                    end,
                    dates=plan.dates_of(start, end),
                    writing=writing,
                    **run_kwargs,
                )
            except Exception as exc:
                raise BackfillError(
                    f"backfill of {plan.source} stopped at {start}{f'..{end}' if end else ''}: {type(exc).__name__}: {exc}"
                ) from exc
            summaries.append(summary)
            progress.step(f"{summary.date}: {summary.entities:,} entities written")
    return summaries
