"""Backfills: repair missed nights or load a feature's history, with the ledger's help.

``latest`` (default) writes, in one pass over the range, each entity's latest good row
(one write per entity, the state that applying the dates in order leaves); ``replay``
runs the dates one by one, in order. Dates a succeeded step already wrote to the same
sinks are skipped unless forced, so a failed backfill resumes where it stopped.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import dataclass, field
from typing import Literal

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from feature_defs import Definitions
from jobs.config import RunConf
from jobs.ledger import Entry, Ledger, config_hash
from jobs.run import read_source, run_source
from jobs.summary import RunSummary

Mode = Literal["latest", "replay"]


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
    already_written: list[dt.date]
    to_write: list[dt.date]
    rows: int = 0
    """Rows of the source in the dates to write."""
    feature_bytes: int = 0
    """Estimated bytes of feature values those rows carry (JSON size of a sample)."""
    running: list[dict] = field(default_factory=list)

    @property
    def steps(self) -> list[tuple[dt.date, dt.date | None]]:
        """(date, end) per run_source call: one range for latest, one date each for replay."""
        if not self.to_write:
            return []
        if self.mode == "replay":
            return [(d, None) for d in self.to_write]
        # From the first date to write up to the last date with data: a later date already
        # written is applied again, so no entity ends older than it was.
        return [(self.to_write[0], self.dates_with_data[-1])]

    def describe(self) -> str:
        fmt = lambda ds: ", ".join(d.isoformat() for d in ds) or "none"  # noqa: E731
        lines = [
            f"backfill {self.source} {self.start}..{self.end} mode {self.mode} into {', '.join(self.sinks)}",
            f"  dates with data:  {fmt(self.dates_with_data)}",
            f"  already written:  {fmt(self.already_written)} (skipped; --force writes them again)",
            f"  to write:         {fmt(self.to_write)}",
        ]
        if self.to_write:
            steps = ", ".join(f"{a}..{b}" if b else str(a) for a, b in self.steps)
            lines.append(f"  steps:            {steps}")
            lines.append(f"  estimated:        {self.rows:,} rows read, about {self.feature_bytes:,} bytes of feature values")
        for r in self.running:
            lines.append(f"  note: step {r['run_id'][:8]} ({r['kind']} {r['start_date']}..{r['end_date']}) is still marked running since {r['started_at']}: live elsewhere, or it crashed")
        return "\n".join(lines)


def plan_backfill(spark: SparkSession, conf: RunConf, defs: Definitions, ledger: Ledger, source_name: str, start: dt.date, end: dt.date, mode: Mode, force: bool) -> Plan:
    if end < start:
        raise BackfillError(f"--end {end} is before --start {start}")
    today = dt.datetime.now(dt.UTC).date()
    if end > today:
        raise BackfillError(f"--end {end} is in the future (today is {today} UTC): no snapshot exists for it yet")
    source = defs.source(source_name)
    raw = read_source(spark, conf, source)
    day = F.col(source.date_column)
    in_range = raw.where(day.between(F.lit(start), F.lit(end)))
    present = sorted(r[0] for r in in_range.select(day).distinct().collect())
    done = set() if force else ledger.written_dates(source.name, list(conf.sinks))
    plan = Plan(
        source=source.name, start=start, end=end, mode=mode, sinks=list(conf.sinks), dates_with_data=present,
        already_written=[d for d in present if d in done], to_write=[d for d in present if d not in done],
        running=ledger.running(source.name),
    )  # fmt: skip
    if plan.to_write:
        rows = in_range.where(day.isin(plan.to_write))
        columns = [f.source_column for f in source.features] if source.layout == "wide" else [source.value_column]
        stats = rows.agg(F.count(F.lit(1)).alias("n"), F.avg(F.length(F.to_json(F.struct(*columns)))).alias("avg")).first()
        plan.rows = stats["n"]
        plan.feature_bytes = int((stats["avg"] or 0) * plan.rows)
    return plan


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


def recorded_run(spark: SparkSession, conf: RunConf, defs: Definitions, ledger: Ledger, kind: str, source_name: str, start: dt.date, end: dt.date | None = None, **run_kwargs) -> RunSummary:
    """run_source with a ledger entry: 'running' before, 'succeeded'/'failed' after."""
    source = defs.source(source_name)
    entry = ledger.start(
        Entry(
            kind=kind, source=source.name, entity=source.entity, start_date=start, end_date=end or start, sinks=list(conf.sinks),
            definitions_hash=defs.digest, config_hash=config_hash(conf), features=[f.name for f in source.features],
        )
    )  # fmt: skip
    try:
        summary = run_source(spark, conf, defs, source.name, start, end=end, **run_kwargs)
    except BaseException as exc:
        ledger.finish(entry, error=exc)
        raise
    ledger.finish(entry, summary)
    return summary


def run_backfill(spark: SparkSession, conf: RunConf, defs: Definitions, ledger: Ledger, plan: Plan, **run_kwargs) -> list[RunSummary]:
    """Run the plan's steps in order, each recorded in the ledger; stop at the first failure."""
    summaries: list[RunSummary] = []
    progress = Progress(len(plan.steps), f"backfill {plan.source}")
    try:
        for start, end in plan.steps:
            try:
                summary = recorded_run(spark, conf, defs, ledger, f"backfill-{plan.mode}", plan.source, start, end, **run_kwargs)
            except Exception as exc:
                raise BackfillError(f"backfill of {plan.source} stopped at {start}{f'..{end}' if end else ''}: {type(exc).__name__}: {exc}") from exc
            summaries.append(summary)
            progress.step(f"{summary.date}: {summary.entities:,} entities written")
    finally:
        progress.close()
    return summaries
