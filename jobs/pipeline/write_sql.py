"""Stage 5, write to the SQL store: the driver-side checks (dialect, table, grants), pre-split
at key quantiles on CockroachDB, full-row upserts from inside the partitions."""

from __future__ import annotations

from dataclasses import replace
import datetime as dt
from functools import partial
import time

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pyspark.sql import DataFrame

from feature_defs import EntityDef, SourceDef
from jobs import transforms as tf
from jobs.config import RunConf
from jobs.partition_writers import SQL_STATS_SCHEMA, SqlWritePlan, sum_partition_stats, write_sql_partition
from jobs.pipeline.context import RunContext
from jobs.progress import progress
from jobs.summary import RunSummary
from serializers.keys import as_of_epoch
from sinks.errors import TerminalSinkError, from_wire, raise_first
from sinks.retry import call_with_retries
from sinks.sql_sink import SqlSinkConfig, detect_dialect, ensure_schema, pre_split
from sinks.sql_sink import connect as sql_connect
from sinks.sql_sink import is_transient as sql_is_transient
from sinks.sql_statements import Dialect, quantile_keys


def sql_sink_config(conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, dialect: Dialect) -> SqlSinkConfig:
    password = conf.sql_password()
    return SqlSinkConfig(
        dsn=conf.sql.dsn,
        table=entity.sql_table,
        schema=conf.sql.db_schema,
        source=source.name,
        as_of=as_of_epoch(date),
        dialect=dialect,
        batch_rows=conf.sql.batch_rows,
        statements_per_transaction=conf.sql.statements_per_transaction,
        statement_timeout_ms=conf.sql.statement_timeout_ms,
        connect_timeout=conf.sql.connect_timeout,
        retries=conf.sql.retries,
        retry_base_delay=conf.sql.retry_base_delay,
        retry_max_delay=conf.sql.retry_max_delay,
        password=password.get_secret_value() if password else None,
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
    """Driver side, before any store is written: connect, learn the dialect, check the
    entity table (created only when missing). A table the writer may not use stops the
    run here, with nothing written to either store."""
    conf = ctx.conf
    sink_conf = sql_sink_config(conf, ctx.source, ctx.entity, ctx.date, "postgres")
    summary.sinks["cockroach"] = {"table": sink_conf.table_name}

    def check() -> SqlSinkConfig:
        with sql_connect(sink_conf) as conn:
            dialect = detect_dialect(conn) if conf.sql.dialect == "auto" else conf.sql.dialect
            checked = replace(sink_conf, dialect=dialect)
            ensure_schema(conn, checked)
            return checked

    try:
        # a server restarting right now gets the same bounded retries as the write
        checked = call_with_retries(check, is_transient=sql_is_transient, retries=conf.sql.retries, base_delay=conf.sql.retry_base_delay, max_delay=conf.sql.retry_max_delay)
    except psycopg.Error as exc:
        raise TerminalSinkError(f"cannot connect to the SQL store ({conf.sql.dsn}): {str(exc).strip()}") from exc
    summary.sinks["cockroach"]["dialect"] = checked.dialect
    if conninfo_to_dict(conf.sql.dsn).get("sslmode", "prefer") != "verify-full" and not _loopback(conf.sql.dsn):
        summary.warnings.append(f"sql.dsn does not use sslmode=verify-full: the SQL store's certificate is not verified ({conf.sql.dsn})")
    return checked


def _loopback(dsn: str) -> bool:
    host = conninfo_to_dict(dsn).get("host") or "localhost"
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("/")


def write_sql(ctx: RunContext, sink_conf: SqlSinkConfig, rows: DataFrame, summary: RunSummary) -> dict:
    """Pre-split (CockroachDB, large writes), then full-row upserts from inside the partitions."""
    spark, conf, source = ctx.spark, ctx.conf, ctx.source
    stats = summary.sinks["cockroach"]
    dialect = sink_conf.dialect
    if dialect == "cockroach" and conf.sql.pre_split and summary.entities >= conf.sql.pre_split_min_rows:
        keys = split_keys(rows, conf.sql.pre_split, summary.entities)
        expires = dt.datetime.now(dt.UTC) + dt.timedelta(hours=conf.sql.split_expiration_hours)
        try:
            with sql_connect(sink_conf) as conn:
                stats["splits"] = pre_split(conn, sink_conf, keys, expires)
        except psycopg.Error as exc:
            # Splitting only spreads the load; a cluster that refuses it (e.g. serverless) still takes the write.
            summary.warnings.append(f"pre-split of {sink_conf.table_name} refused, writing without it: {str(exc).strip()}")
    start = time.perf_counter()
    with progress(spark, f"write {source.name} to {dialect}"):
        plan = SqlWritePlan(sink=sink_conf, as_of_column=tf.AS_OF if tf.AS_OF in rows.columns else None)
        parts = rows.sortWithinPartitions(tf.ENTITY_ID).mapInArrow(partial(write_sql_partition, plan), SQL_STATS_SCHEMA).collect()
    seconds = time.perf_counter() - start
    keys = ("rows_upserted", "rows_skipped_newer", "statements", "transactions", "retries", "reconnects", "duplicates", "non_finite", "bytes_sent")
    sum_partition_stats(stats, parts, keys, seconds, rate=("rows_per_s", "rows_upserted"))
    if stats["rows_skipped_newer"]:
        summary.warnings.append(
            f"{dialect}: {stats['rows_skipped_newer']:,} rows already hold a newer snapshot of {source.name} and were left as they are"
        )
    errors = [from_wire(p["error_kind"], p["error"]) for p in parts if p["error"]]
    raise_first(
        errors,
        f"SQL write to {sink_conf.table_name} failed in {len(errors)} of {len(parts)} writer(s) after "
        f"{stats['rows_upserted']:,} of {summary.entities:,} rows were upserted (a rerun repeats them safely)",
    )
    return stats
