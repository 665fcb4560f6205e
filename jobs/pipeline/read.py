"""Stage 1, read: the source's Delta table, located under data_root (or at its own URI)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from feature_defs import SourceDef
from fm_config import RunConf
from fm_config.locations import Location, is_uri
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


def partition_rows(spark: SparkSession, conf: RunConf, source: SourceDef, date: dt.date) -> int:
    """Whether the source has rows for ``date`` (0 or 1: stops at the first row)."""
    try:
        raw = read_source(spark, conf, source)
    except SourceNotFound:
        return 0
    return raw.where(F.col(source.date_column) == F.lit(date)).limit(1).count()
