"""The nightly job for one source and one date: read, check, encode, write, report.

parse args -> load conf -> build Spark -> read one date -> transform -> quarantine
-> capacity check -> write inside partitions -> summary. The steps are the pure
transforms of :mod:`jobs.transforms`; this module only wires them to I/O.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from feature_defs import Definitions, EntityDef, SourceDef
from jobs import transforms as tf
from jobs.config import RunConf
from jobs.partition_writers import STATS_SCHEMA, RedisWritePlan, write_redis_partition
from jobs.progress import progress
from jobs.summary import RunSummary
from serializers import field_id, freshness_field_name
from serializers.batch import FeatureSpec, encode_batch
from sinks.errors import CapacityError
from sinks.redis_capacity import project_growth, read_memory_info
from sinks.redis_sink import RedisSinkConfig, connect

log = logging.getLogger(__name__)


class BadInputError(ValueError):
    """Too much of the snapshot is bad input: nothing was written to the stores."""


class SourceNotFound(FileNotFoundError):
    pass


def as_of_epoch(date: dt.date) -> int:
    """A date's snapshot is as of the end of that day, UTC (the next midnight)."""
    return int(dt.datetime.combine(date + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC).timestamp())


def key_prefix(entity: EntityDef, namespace: str | None) -> str:
    return f"{namespace}:{entity.prefix}:" if namespace else f"{entity.prefix}:"


def source_path(conf: RunConf, source: SourceDef) -> str:
    loc = source.location
    if "://" in loc or Path(loc).is_absolute():
        return loc
    return str(conf.data_path / loc)


def read_source(spark: SparkSession, conf: RunConf, source: SourceDef) -> DataFrame:
    path = source_path(conf, source)
    if "://" not in path and not (Path(path) / "_delta_log").is_dir():
        raise SourceNotFound(
            f"source {source.name!r}: no Delta table at {path} (for the local sample data run `materialize sample-data`)"
        )
    return spark.read.format("delta").load(path)


@dataclass
class Prepared:
    """A snapshot after the checks: rows to write, rows to quarantine, counts."""

    good: DataFrame
    quarantine: DataFrame
    cached: list[DataFrame]


def prepare(spark: SparkSession, conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, summary: RunSummary) -> Prepared:
    raw = read_source(spark, conf, source)
    tf.check_schema(raw, source, entity)
    snapshot = raw.where(F.col(source.date_column) == F.lit(date))
    tagged = tf.tag_key_problems(snapshot, source, entity).persist()
    bad = tf.is_bad(tagged)
    aggs = [F.count(F.lit(1)).alias("rows"), F.sum(bad.cast("long")).alias("bad")]
    if source.layout == "long":
        defined = F.col(source.name_column).isin([f.source_column for f in source.features])
        aggs.append(F.sum((~bad & ~defined).cast("long")).alias("ignored"))
        aggs.append(F.count_distinct(F.when(~bad & defined, F.struct(*tf.key_columns(source, entity), source.name_column))).alias("latest"))
    counts = tagged.agg(*aggs).first()
    summary.rows_read = counts["rows"]
    key_bad = counts["bad"] or 0
    good_rows = tagged.where(~bad)
    if source.layout == "wide":
        features = tf.wide_features(good_rows, source, entity)
    else:
        features = tf.long_features(good_rows, source, entity)
        summary.ignored_rows = counts["ignored"] or 0
    checked = tf.with_entity_id(tf.tag_value_problems(features, source), source, entity).persist()
    counts2 = checked.agg(F.count(F.lit(1)).alias("rows"), F.sum(tf.is_bad(checked).cast("long")).alias("bad")).first()
    value_bad = counts2["bad"] or 0
    summary.entities = counts2["rows"] - value_bad
    summary.bad_rows = key_bad + value_bad
    kept = counts["latest"] if source.layout == "long" else counts2["rows"]
    summary.superseded_rows = summary.rows_read - key_bad - summary.ignored_rows - kept
    quarantine = tf.quarantine_rows(tagged, source, date.isoformat(), "key").unionByName(
        tf.quarantine_rows(checked.drop(tf.ENTITY_ID), source, date.isoformat(), "value")
    )
    return Prepared(good=tf.encode_ready(checked, source), quarantine=quarantine, cached=[tagged, checked])


def write_quarantine(conf: RunConf, source: SourceDef, date: dt.date, quarantine: DataFrame, summary: RunSummary) -> None:
    """Replace this (source, date)'s quarantined rows: a rerun leaves the same table."""
    path = str(conf.quarantine_path / source.name)
    (
        quarantine.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", f"ds = '{date.isoformat()}'")
        .partitionBy("ds")
        .save(path)
    )
    summary.quarantine_table = path
    reasons = quarantine.select(F.explode("reasons").alias("reason")).groupBy("reason").count().collect()
    summary.bad_reasons = {r["reason"]: r["count"] for r in reasons}


def _feature_specs(source: SourceDef) -> tuple[FeatureSpec, ...]:
    return tuple(FeatureSpec(f.name, f.type, f.options) for f in source.features)


def redis_sink_config(conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, ceiling: int | None, url: str | None = None) -> RedisSinkConfig:
    password = conf.redis_password()
    return RedisSinkConfig(
        url=url or conf.redis.url,
        key_prefix=key_prefix(entity, conf.redis.namespace),
        fields=tuple(field_id(f.name) for f in source.features),
        freshness_field=field_id(freshness_field_name(source.name)),
        as_of=as_of_epoch(date),
        ttl_seconds=entity.ttl_seconds,
        ttl_jitter=conf.redis.ttl_jitter,
        chunk_entities=conf.redis.pipeline_entities,
        retries=conf.redis.retries,
        socket_timeout=conf.redis.socket_timeout,
        ceiling_bytes=ceiling,
        recheck_every=conf.redis.recheck_every,
        username=conf.redis.username,
        password=password.get_secret_value() if password else None,
    )


def write_redis(spark: SparkSession, conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, good: DataFrame, summary: RunSummary, url: str | None = None) -> dict:
    sink_conf = redis_sink_config(conf, source, entity, date, None, url)
    client = connect(sink_conf.url, password=sink_conf.password, username=sink_conf.username)
    try:
        memory = read_memory_info(client)
        capacity = memory.capacity(conf.redis.capacity_bytes)
        specs = _feature_specs(source)
        # Project growth from an encoded random sample (small: it comes to the driver).
        fraction = min(1.0, 2.0 * conf.redis.sample_entities / max(1, summary.entities))
        sample = good.sample(fraction=fraction, seed=17).limit(conf.redis.sample_entities).toArrow()
        rows: list[list] = []
        keys: list[bytes] = []
        if sample.num_rows:
            encoded = encode_batch(sample.combine_chunks().to_batches()[0], list(specs))
            columns = [c.to_pylist() for c in encoded.columns]
            ts = str(sink_conf.as_of).encode()
            keys = [(sink_conf.key_prefix + i).encode() for i in encoded.ids]
            rows = [[col[i] for col in columns] + [ts] for i in range(len(keys))]
        projection = project_growth(
            client,
            entity_type=entity.name,
            keys=keys,
            rows=rows,
            source_fields=[*sink_conf.fields, sink_conf.freshness_field],
            ttl=bool(entity.ttl_seconds),
            total_entities=summary.entities,
            memory=memory,
            capacity=capacity,
            max_fill=conf.redis.max_fill,
        )
        summary.warnings.extend(projection.warnings())
        stats: dict = {
            "memory_before": memory.used,
            "capacity": capacity,
            "projected_growth": projection.projected_growth,
            "predicted_encoding": projection.predicted_encoding,
        }
        summary.sinks["redis"] = stats
        projection.check()  # raises CapacityError: nothing written

        ceiling = int(capacity * conf.redis.hard_fill)
        plan = RedisWritePlan(
            sink=redis_sink_config(conf, source, entity, date, ceiling, url),
            features=specs,
        )
        start = time.perf_counter()
        with progress(spark, f"write {source.name} to redis"):
            parts = good.mapInArrow(partial(write_redis_partition, plan), STATS_SCHEMA).collect()
        seconds = time.perf_counter() - start
        for key in ("entities", "values_set", "values_deleted", "non_finite", "bytes_sent", "round_trips", "retries"):
            stats[key] = sum(p[key] for p in parts)
        stats["memory_after"] = int(client.info("memory")["used_memory"])
        stats["write_seconds"] = seconds
        stats["values_per_s"] = stats["values_set"] / seconds if seconds else 0.0
        stopped = [p["stopped"] for p in parts if p["stopped"]]
        if stopped:
            raise CapacityError(
                f"Redis write stopped at the hard ceiling ({conf.redis.hard_fill:.0%} of {capacity:,} B): "
                f"{stats['entities']:,} of {summary.entities:,} entities ({stats['values_set']:,} values) were written "
                f"before {len(stopped)} writer(s) stopped; first: {stopped[0]}"
            )
        return stats
    finally:
        client.close()


def run_source(
    spark: SparkSession,
    conf: RunConf,
    defs: Definitions,
    source_name: str,
    date: dt.date,
    *,
    redis_url: str | None = None,
    report: bool = True,
) -> RunSummary:
    """Materialize one source for one date; the summary is written even on failure."""
    source = defs.source(source_name)
    entity = defs.entity_of(source)
    summary = RunSummary(source=source.name, entity=entity.name, date=date.isoformat(), env=conf.env, as_of=as_of_epoch(date))
    start = time.perf_counter()
    prepared = None
    try:
        with progress(spark, f"check {source.name}"):
            prepared = prepare(spark, conf, source, entity, date, summary)
            write_quarantine(conf, source, date, prepared.quarantine, summary)
        if summary.bad_fraction > conf.quality.max_bad_fraction:
            raise BadInputError(
                f"source {source.name!r} {date}: {summary.bad_rows:,} of {summary.rows_read:,} rows are bad input "
                f"({summary.bad_fraction:.2%} > quality.max_bad_fraction {conf.quality.max_bad_fraction:.2%}); "
                f"nothing was written. Reasons: {summary.bad_reasons}. Rows kept in {summary.quarantine_table}"
            )
        if "redis" in conf.sinks:
            write_redis(spark, conf, source, entity, date, prepared.good, summary, redis_url)
        summary.status = "succeeded"
        return summary
    except Exception as exc:
        summary.status = "failed"
        summary.error = f"{type(exc).__name__}: {exc}"
        raise
    finally:
        summary.seconds = time.perf_counter() - start
        if prepared:
            for df in prepared.cached:
                df.unpersist()
        if report:
            summary.write_json(report_path(conf, source.name, date))


def report_path(conf: RunConf, source: str, date: dt.date) -> Path:
    return conf.reports_path / source / date.isoformat() / "summary.json"
