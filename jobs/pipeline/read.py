"""Stage 1, read: the source's table (jobs/pipeline/source_table.py opens it: Delta or
Parquet at a location, or a catalog table), its columns checked first."""

from __future__ import annotations

import datetime as dt

from pyspark.sql import DataFrame, SparkSession

from feature_defs import SourceDef
from fm_config import RunConf
from jobs import event_time
from jobs import transforms as tf
from jobs.pipeline.context import RunContext
from jobs.pipeline.source_table import SourceNotFound, dated, open_source, source_path, table_ref

__all__ = ["SourceNotFound", "SourceNotReady", "ensure_ready", "not_ready", "partition_rows", "read", "source_path"]


def read(ctx: RunContext) -> DataFrame:
    """The source's table, its columns and types checked against the definition first
    (drift fails here, before anything is written). Lazy: prepare's actions read the rows."""
    raw = open_source(ctx.spark, ctx.conf, ctx.source)
    tf.check_schema(raw, ctx.source, ctx.entity, str(table_ref(ctx.conf, ctx.source)))
    return raw


class SourceNotReady(RuntimeError):
    """The source has no rows for the date (or range): nothing to write, nothing recorded.

    Not a success: a date of 0 entities would read as every entity gone, and as the anchor of
    the row-count band it would fail every later date. Exit code 3, as `materialize ready`."""

    report_status = "not ready"
    """What a report written for such a run says (jobs/pipeline/report/stage.py)."""


def source_rows(raw: DataFrame, source: SourceDef) -> DataFrame:
    """The rows of ``raw`` that belong to the source: a long layout's rows of its defined feature
    names (a table shared by several sources has rows of other names, which are not this source's)."""
    if source.layout == "long":
        return raw.where(tf.col(source.name_column).isin([f.source_column for f in source.features]))
    return raw


def partition_rows(spark: SparkSession, conf: RunConf, source: SourceDef, date: dt.date, end: dt.date | None = None) -> int:
    """Whether the source has rows for ``date`` (or ``date``..``end``): 0 or 1, stops at the first
    row. No table yet: 0."""
    try:
        raw = open_source(spark, conf, source)
    except SourceNotFound:
        return 0
    return _has_rows(raw, source, date, end)


def _has_rows(raw: DataFrame, source: SourceDef, date: dt.date, end: dt.date | None) -> int:
    if source.by_event_time:  # rows of the date's day (jobs/event_time.py)
        return event_time.rows_in(raw, source, event_time.day_window(date))
    return source_rows(dated(raw, source.date_column, date, end, source=source.name), source).limit(1).count()


def not_ready(
    conf: RunConf, source: SourceDef, date: dt.date, end: dt.date | None = None, done: str = "nothing was written or recorded"
) -> SourceNotReady:
    """The error of a date (or range) without rows, naming source, date and table."""
    if source.by_event_time:
        return SourceNotReady(event_time.no_rows(source, event_time.day_window(date), table_ref(conf, source), done))
    dates = f"{date}..{end}" if end else str(date)
    what = f"rows of its {len(source.features)} feature names ({source.name_column})" if source.layout == "long" else "rows"
    return SourceNotReady(
        f"source {source.name!r} has no {what} for {dates} ({source.date_column}) in {table_ref(conf, source)}: "
        f"not ready; {done} (run it again once the partition has rows; `materialize ready` says when)"
    )


def ensure_ready(spark: SparkSession, conf: RunConf, source: SourceDef, date: dt.date, end: dt.date | None = None) -> None:
    """Raise :class:`SourceNotReady` unless the source has rows for the date (or range). A table
    that is not there is left to the run's read, which fails naming it (a location to fix, not
    a date to wait for; a run records that failure)."""
    try:
        raw = open_source(spark, conf, source)
    except SourceNotFound:
        return
    if not _has_rows(raw, source, date, end):
        raise not_ready(conf, source, date, end)
