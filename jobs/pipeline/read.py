"""Stage 1, read: the source's Delta table, located under data_root (or at its own URI)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from feature_defs import SourceDef
from fm_config import RunConf
from fm_config.locations import Location, is_uri
from jobs import event_time
from jobs import transforms as tf
from jobs.pipeline.context import RunContext


class SourceNotFound(FileNotFoundError):
    pass


def source_path(conf: RunConf, source: SourceDef) -> Location:
    """The source's table: its location as a URI or absolute path, else under data_root."""
    loc = source.location
    if is_uri(loc) or Path(loc).is_absolute():
        return Location(loc)
    return conf.data_path / loc


def read_source(spark: SparkSession, conf: RunConf, source: SourceDef) -> DataFrame:
    path = source_path(conf, source)
    if path.is_local and not (Path(path) / "_delta_log").is_dir():
        raise SourceNotFound(f"source {source.name!r}: no Delta table at {path} (for the local sample data run `materialize sample-data`)")
    return spark.read.format("delta").load(path)


def read(ctx: RunContext) -> DataFrame:
    """The source's table, its columns and types checked against the definition first
    (drift fails here, before anything is written). Lazy: prepare's actions read the rows."""
    raw = read_source(ctx.spark, ctx.conf, ctx.source)
    tf.check_schema(raw, ctx.source, ctx.entity)
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
        return raw.where(F.col(source.name_column).isin([f.source_column for f in source.features]))
    return raw


def partition_rows(spark: SparkSession, conf: RunConf, source: SourceDef, date: dt.date, end: dt.date | None = None) -> int:
    """Whether the source has rows for ``date`` (or ``date``..``end``): 0 or 1, stops at the first
    row. No table yet: 0."""
    try:
        raw = read_source(spark, conf, source)
    except SourceNotFound:
        return 0
    return _has_rows(raw, source, date, end)


def _has_rows(raw: DataFrame, source: SourceDef, date: dt.date, end: dt.date | None) -> int:
    if source.by_event_time:  # rows of the date's day (jobs/event_time.py)
        return event_time.rows_in(raw, source, event_time.day_window(date))
    day = F.col(source.date_column)
    dated = raw.where(day.between(F.lit(date), F.lit(end)) if end else day == F.lit(date))
    return source_rows(dated, source).limit(1).count()


def not_ready(
    conf: RunConf, source: SourceDef, date: dt.date, end: dt.date | None = None, done: str = "nothing was written or recorded"
) -> SourceNotReady:
    """The error of a date (or range) without rows, naming source, date and table."""
    if source.by_event_time:
        return SourceNotReady(event_time.no_rows(source, event_time.day_window(date), source_path(conf, source), done))
    dates = f"{date}..{end}" if end else str(date)
    what = f"rows of its {len(source.features)} feature names ({source.name_column})" if source.layout == "long" else "rows"
    return SourceNotReady(
        f"source {source.name!r} has no {what} for {dates} ({source.date_column}) in {source_path(conf, source)}: "
        f"not ready; {done} (run it again once the partition has rows; `materialize ready` says when)"
    )


def ensure_ready(spark: SparkSession, conf: RunConf, source: SourceDef, date: dt.date, end: dt.date | None = None) -> None:
    """Raise :class:`SourceNotReady` unless the source has rows for the date (or range). A table
    that is not there is left to the run's read, which fails naming it (a location to fix, not
    a date to wait for; a run records that failure)."""
    try:
        raw = read_source(spark, conf, source)
    except SourceNotFound:
        return
    if not _has_rows(raw, source, date, end):
        raise not_ready(conf, source, date, end)
