"""Stage 5, write to the SQL store: the store's preflight on the driver (dialect, table,
grants: sinks/sql/preflight.py), pre-split at key quantiles on CockroachDB, full-row
upserts from inside the partitions."""

from __future__ import annotations

import datetime as dt
import time
from functools import partial

import psycopg
from pyspark.sql import DataFrame

from jobs import transforms as tf
from jobs.pipeline.context import RunContext
from jobs.pipeline.report.summary import RunSummary
from jobs.pipeline.snapshot_order import future_warning, newer_kept
from jobs.pipeline.store_record import sql_after
from jobs.progress import progress
from serializers.description import Description
from sinks.errors import from_wire, raise_first
from sinks.partition import partition_schema, sum_partition_stats, write_partition
from sinks.sql.config import SqlSinkConfig
from sinks.sql.description import record_description
from sinks.sql.preflight import pre_split, preflight
from sinks.sql.statements import quantile_keys
from sinks.sql.writer import SqlWritePlan
from stores.sql import connect

_SUMMED = (
    "rows_upserted",
    "rows_skipped_newer",
    "rows_replaced_future",
    "expiry_followed",
    "statements",
    "transactions",
    "retries",
    "reconnects",
    "duplicates",
    "non_finite",
    "bytes_sent",
)


def split_keys(rows: DataFrame, splits: int, total: int, sample_per_split: int = 64) -> list[str]:
    """Entity keys at ``splits`` quantiles, from a sorted random sample taken in Spark."""
    if splits < 1 or total < 1:
        return []
    target = splits * sample_per_split
    fraction = min(1.0, 2.0 * target / total)
    sample = rows.select(tf.ENTITY_ID).sample(fraction=fraction, seed=23).limit(2 * target).orderBy(tf.ENTITY_ID)
    return quantile_keys([r[0] for r in sample.collect()], splits)


def prepare_sql(ctx: RunContext, summary: RunSummary) -> SqlSinkConfig:
    """Driver side, before any store is written: the store's preflight (dialect, table, grants)."""
    config = ctx.sql_config()
    summary.sinks["sql"] = {"table": config.table_name}
    checked = preflight(ctx.conf.sql, config, summary.warnings)
    summary.sinks["sql"]["dialect"] = checked.dialect
    return checked


def write_sql(
    ctx: RunContext, sink_conf: SqlSinkConfig, rows: DataFrame, summary: RunSummary, described: Description | None = None
) -> dict:
    """Record what the table holds (``described``: jobs/pipeline/describe.py), pre-split
    (CockroachDB, large writes), then full-row upserts from inside the partitions."""
    spark, conf, source = ctx.spark, ctx.conf, ctx.source
    stats = summary.sinks["sql"]
    if described:
        with connect(sink_conf) as conn:
            record_description(conn, sink_conf.schema, sink_conf.table, described)
        stats["described"] = len(described)
    dialect = sink_conf.dialect
    if dialect == "cockroach" and conf.sql.pre_split and summary.entities >= conf.sql.pre_split_min_rows:
        keys = split_keys(rows, conf.sql.pre_split, summary.entities)
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(hours=conf.sql.split_expiration_hours)
        try:
            with connect(sink_conf) as conn:
                stats["splits"] = pre_split(conn, sink_conf, keys, expires)
        except psycopg.Error as exc:
            # Splitting only spreads the load; a cluster that refuses it (e.g. serverless) still takes the write.
            summary.warnings.append(f"pre-split of {sink_conf.table_name} refused, writing without it: {str(exc).strip()}")
    start = time.perf_counter()
    with progress(spark, f"write {source.name} to {dialect}"):
        plan = SqlWritePlan(sink=sink_conf, as_of_column=tf.AS_OF if tf.AS_OF in rows.columns else None)
        parts = rows.sortWithinPartitions(tf.ENTITY_ID).mapInArrow(partial(write_partition, plan), partition_schema(plan)).collect()
    sum_partition_stats(stats, parts, _SUMMED, time.perf_counter() - start, rate=("rows_per_s", "rows_upserted"))
    if stats["rows_skipped_newer"]:
        summary.warnings.append(newer_kept(ctx, dialect, stats["rows_skipped_newer"], "rows"))
    if stats["rows_replaced_future"]:
        summary.warnings.append(future_warning(dialect, stats["rows_replaced_future"], "rows", ctx))
    errors = [from_wire(p["error_kind"], p["error"]) for p in parts if p["error"]]
    raise_first(
        errors,
        f"SQL write to {sink_conf.table_name} failed in {len(errors)} of {len(parts)} writer(s) after "
        f"{stats['rows_upserted']:,} of {summary.entities:,} rows were upserted (a rerun repeats them safely)",
    )
    stats["store"] = sql_after(ctx, sink_conf, rows, summary)
    return stats
