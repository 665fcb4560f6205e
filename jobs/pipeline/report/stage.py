"""Stage 7, report: the summary of a run (also on failure) as JSON under <reports_dir>/<source>/<date>/ (a path or URI)."""

from __future__ import annotations

import datetime as dt
import time
from typing import TYPE_CHECKING

from fm_config import RunConf
from fm_config.locations import Files, Location
from jobs.pipeline.report.summary import RunSummary

if TYPE_CHECKING:  # `materialize report` reads a summary without Spark
    from jobs.pipeline.context import RunContext
    from jobs.pipeline.prepare import Prepared


class RecordedStep:
    """Times one source's run, validation or verification, records its outcome in the
    summary and always writes the report (also on failure), then releases the cached data."""

    def __init__(self, summary: RunSummary, report: Location | None, done: str, files: Files):
        self.summary, self.report, self.done, self.files = summary, report, done, files
        self.prepared: Prepared | None = None

    def __enter__(self) -> RecordedStep:
        self.start = time.perf_counter()
        return self

    def __exit__(self, kind, exc, tb) -> None:
        summary = self.summary
        if exc is None:
            summary.status = self.done
        else:
            summary.status = getattr(exc, "report_status", "failed")  # e.g. "not ready": no rows for the date
            summary.error = f"{type(exc).__name__}: {exc}"
        if self.prepared:
            self.prepared.release()
        if self.report:
            with summary.stage("report"):
                summary.seconds = time.perf_counter() - self.start
                summary.write_json(self.report, self.files)  # its own time is the one the file cannot hold
        summary.seconds = time.perf_counter() - self.start


def new_summary(ctx: RunContext, env: str) -> RunSummary:
    date = f"{ctx.date.isoformat()}..{ctx.end.isoformat()}" if ctx.end else ctx.date.isoformat()
    window = ctx.window.describe(ctx.source) if ctx.window else None
    return RunSummary(source=ctx.source.name, entity=ctx.entity.name, date=date, env=env, as_of=ctx.as_of, window=window)


def report_dir(conf: RunConf, source: str, date: dt.date, end: dt.date | None = None, *, name: str | None = None) -> Location:
    """reports/<source>/<date>/ (a range: <start>_<end>/; an incremental run: ``name``, its
    window's end): summary.json, validation.json, data_docs/."""
    return conf.reports_path / source / (name or (f"{date.isoformat()}_{end.isoformat()}" if end else date.isoformat()))


def report_path(conf: RunConf, source: str, date: dt.date) -> Location:
    return report_dir(conf, source, date) / "summary.json"
