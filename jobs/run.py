"""The nightly job for one source and one date: read, check, encode, write, report.

parse args -> load conf -> build Spark -> read one date -> transform -> quarantine
-> capacity check -> write inside partitions -> summary. The steps are the pure
transforms of :mod:`jobs.transforms`; this module only wires them to I/O.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from feature_defs import Definitions, EntityDef, SourceDef
from jobs import quality, verify
from jobs import transforms as tf
from jobs.config import RunConf
from jobs.partition_writers import (
    SQL_STATS_SCHEMA,
    STATS_SCHEMA,
    RedisWritePlan,
    SqlWritePlan,
    write_redis_partition,
    write_sql_partition,
)
from jobs.progress import progress
from jobs.quality import QualityGateError
from jobs.summary import RunSummary
from serializers import field_id
from serializers.keys import as_of_epoch, freshness_field, key_prefix
from serializers.batch import encode_batch
from sinks.errors import CapacityError, TerminalSinkError, from_wire, raise_first
from sinks.redis_capacity import MemoryInfo, Projection, project_growth, read_memory_info
from sinks.redis_cluster import SLOTS, ClusterTopology, KeyRouter, is_cluster, key_slots, node_url
from sinks.redis_sink import KeysEvicted, RedisRestarted, RedisSinkConfig, RedisTls, connect, node_address
from sinks.redis_sink import is_transient as redis_is_transient
from sinks.retry import call_with_retries
from sinks.sql_sink import SqlSinkConfig, detect_dialect, ensure_schema, pre_split
from sinks.sql_sink import connect as sql_connect
from sinks.sql_sink import is_transient as sql_is_transient
from sinks.sql_statements import Dialect, quantile_keys

log = logging.getLogger(__name__)


class BadInputError(QualityGateError, ValueError):
    """Too much of the snapshot is bad input: nothing was written to the stores."""


class SourceNotFound(FileNotFoundError):
    pass


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

    snapshot: DataFrame
    """What the expectations check: one row per entity after de-duplication, bad values
    included, plus the rows whose key is unusable (with null features)."""
    good: DataFrame
    """Rows for the Redis writers: _id and the feature columns."""
    sql_good: DataFrame | None
    """Rows for the SQL writers: _id, JSON object, omitted NaN/inf (when that sink runs)."""
    quarantine: DataFrame
    cached: list[DataFrame]


def prepare(
    spark: SparkSession, conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, summary: RunSummary, end: dt.date | None = None
) -> Prepared:
    """Read the date's snapshot and split it into rows to write and rows to quarantine.

    With ``end``, a range of dates: each date is de-duplicated and checked on its own, and
    each entity's good row of its latest date is written, with that date's as-of time
    (the state that applying the dates in order would leave).

    With the SQL sink in the run, each row's JSON object is built here, so an object over
    ``sql.max_map_bytes`` is bad input like any other: quarantined, written to no store.
    """
    with summary.stage("read"):  # the table's log and schema; the rows are read by the actions below
        raw = read_source(spark, conf, source)
        tf.check_schema(raw, source, entity)
    per_date = end is not None
    day = F.col(source.date_column)
    snapshot = raw.where(day.between(F.lit(date), F.lit(end)) if per_date else day == F.lit(date))
    dated = [source.date_column] if per_date else []
    tagged = tf.tag_key_problems(snapshot, source, entity).persist()
    bad = tf.is_bad(tagged)
    aggs = [F.count(F.lit(1)).alias("rows"), F.sum(bad.cast("long")).alias("bad")]
    if source.layout == "long":
        defined = F.col(source.name_column).isin([f.source_column for f in source.features])
        aggs.append(F.sum((~bad & ~defined).cast("long")).alias("ignored"))
        aggs.append(F.count_distinct(F.when(~bad & defined, F.struct(*tf.key_columns(source, entity), *dated, source.name_column))).alias("latest"))
    counts = tagged.agg(*aggs).first()
    summary.rows_read = counts["rows"]
    key_bad = counts["bad"] or 0
    # Partitions by entity key, as many as the size needs: each task's share (and the cached
    # blocks) stays the same size however large the snapshot; the de-duplication reuses it.
    partitions = max(conf.spark.shuffle_partitions, math.ceil(summary.rows_read / conf.spark.rows_per_partition))
    good_rows = tagged.where(~bad).repartition(partitions, *tf.key_columns(source, entity))
    if source.layout == "wide":
        features = tf.wide_features(good_rows, source, entity, per_date)
    else:
        features = tf.long_features(good_rows, source, entity, per_date)
        summary.ignored_rows = counts["ignored"] or 0
    checked = tf.with_entity_id(tf.tag_value_problems(features, source), source, entity)
    if "cockroach" in conf.sinks:
        checked = tf.with_json_maps(checked, source, conf.sql.max_map_bytes)
        if not per_date:
            # The SQL writers send rows sorted by key. Sorted here, as the snapshot is cached,
            # the write streams at once instead of leaving the database idle during a sort.
            checked = checked.sortWithinPartitions(tf.ENTITY_ID)
    checked = checked.persist()
    counts2 = checked.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(tf.is_bad(checked).cast("long")).alias("bad"),
        F.sum((F.col(tf.CONFLICTS) > 0).cast("long")).alias("conflicts"),
    ).first()
    value_bad = counts2["bad"] or 0
    summary.conflicting_keys = counts2["conflicts"] or 0
    summary.snapshot_entities = counts2["rows"] + key_bad
    summary.entities = counts2["rows"] - value_bad
    summary.bad_rows = key_bad + value_bad
    kept = counts["latest"] if source.layout == "long" else counts2["rows"]
    summary.superseded_rows = summary.rows_read - key_bad - summary.ignored_rows - kept
    written = checked
    if per_date:
        written = tf.latest_good_date(checked, source, entity)
        if "cockroach" in conf.sinks:
            written = written.sortWithinPartitions(tf.ENTITY_ID)
        written = written.persist()
        latest = written.count()
        summary.earlier_dates = summary.entities - latest
        summary.entities = latest
    # Long sources and date ranges read many rows per entity: the writers get as many
    # partitions as the entities need (each opens its own connections). Merging gives up
    # the order, so the SQL write then sorts again.
    writers = max(conf.spark.shuffle_partitions, math.ceil(summary.entities / conf.spark.rows_per_partition))
    merge = writers < written.rdd.getNumPartitions()

    def for_writers(df: DataFrame) -> DataFrame:
        return df.coalesce(writers) if merge else df

    ds = None if per_date else date.isoformat()
    quarantine = tf.quarantine_rows(tagged, source, ds, "key").unionByName(tf.quarantine_rows(checked.drop(tf.ENTITY_ID), source, ds, "value"))
    return Prepared(
        snapshot=tf.snapshot_for_checks(checked, tagged, source, entity, per_date),
        good=for_writers(tf.encode_ready(written, source)),
        sql_good=for_writers(tf.sql_ready(written)) if "cockroach" in conf.sinks else None,
        quarantine=quarantine,
        cached=[tagged, checked, *([written] if per_date else [])],
    )


def write_quarantine(conf: RunConf, source: SourceDef, date: dt.date, quarantine: DataFrame, summary: RunSummary, end: dt.date | None = None) -> None:
    """Replace this (source, date or dates)'s quarantined rows: a rerun leaves the same table."""
    path = str(conf.quarantine_path / source.name)
    where = f"ds >= '{date.isoformat()}' AND ds <= '{end.isoformat()}'" if end else f"ds = '{date.isoformat()}'"
    (
        quarantine.write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", where)
        .partitionBy("ds")
        .save(path)
    )
    summary.quarantine_table = path
    count_reasons(quarantine, summary)


def count_reasons(quarantine: DataFrame, summary: RunSummary) -> None:
    reasons = quarantine.select(F.explode("reasons").alias("reason")).groupBy("reason").count().collect()
    summary.bad_reasons = {r["reason"]: r["count"] for r in reasons}


def _sum_partition_stats(stats: dict, parts: list, keys: tuple[str, ...], seconds: float, rate: tuple[str, str]) -> None:
    """Add up the writers' stats rows; ``rate`` is (name, counted key) of the per-second figure."""
    for key in keys:
        stats[key] = sum(p[key] for p in parts)
    # memory per Python worker, the figure that must stay flat as the data grows
    stats["worker_peak_rss"] = max((p["peak_rss"] for p in parts), default=0)
    # the rest of write_seconds is Spark's: scheduling, starting workers, the rows' first batch
    stats["slowest_writer_seconds"] = max((p["seconds"] for p in parts), default=0.0)
    stats["write_seconds"] = seconds
    stats[rate[0]] = stats[rate[1]] / seconds if seconds else 0.0


def redis_sink_config(conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, ceiling: int | None, url: str | None = None) -> RedisSinkConfig:
    password = conf.redis_password()
    return RedisSinkConfig(
        url=url or conf.redis.url,
        key_prefix=key_prefix(entity.prefix, conf.redis.namespace),
        fields=tuple(field_id(f.name) for f in source.features),
        freshness_field=freshness_field(source.name),
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
        tls=redis_tls(conf),
        wait_replicas=conf.redis.wait_replicas,
        wait_timeout_ms=conf.redis.wait_timeout_ms,
        failover_timeout=conf.redis.failover_timeout,
    )


def redis_tls(conf: RunConf) -> RedisTls:
    """The redis.tls_* files, relative ones under the project root (executors may run elsewhere)."""
    r = conf.redis
    ca, cert, key = (str(conf.path(value)) if value else None for value in (r.tls_ca_file, r.tls_cert_file, r.tls_key_file))
    return RedisTls(ca_file=ca, cert_file=cert, key_file=key)


@dataclass
class _Primary:
    """One Redis server to check before the write: the server, or a cluster primary."""

    address: str | None
    client: object
    memory: MemoryInfo | None
    capacity: int


def is_redis_cluster(conf: RunConf, sink_conf: RedisSinkConfig) -> bool:
    """True for Redis Cluster: as configured, or asked of the server (INFO cluster)."""
    if conf.redis.mode != "auto":
        return conf.redis.mode == "cluster"
    client = connect(sink_conf.url, password=sink_conf.password, username=sink_conf.username, tls=sink_conf.tls)
    try:
        return call_with_retries(lambda: is_cluster(client), is_transient=redis_is_transient, retries=conf.redis.retries)
    finally:
        client.close()


def _redis_primaries(conf: RunConf, sink_conf: RedisSinkConfig, topology: ClusterTopology | None) -> list[_Primary]:
    options = dict(password=sink_conf.password, username=sink_conf.username, tls=sink_conf.tls)
    addresses: list[str | None] = list(topology.primaries) if topology else [None]
    out: list[_Primary] = []
    try:
        for address in addresses:
            client = connect(node_url(sink_conf.url, address) if address else sink_conf.url, **options)
            out.append(_Primary(address, client, None, 0))
            out[-1].memory = read_memory_info(client, conf.redis.hash_max_listpack_entries, conf.redis.hash_max_listpack_value)
            out[-1].capacity = out[-1].memory.capacity(conf.redis.capacity_bytes)
    except BaseException:
        for p in out:
            p.client.close()
        raise
    return out


def write_redis(spark: SparkSession, conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, good: DataFrame, summary: RunSummary, url: str | None = None) -> dict:
    sink_conf = redis_sink_config(conf, source, entity, date, None, url)
    cluster = is_redis_cluster(conf, sink_conf)
    topology = ClusterTopology.discover(sink_conf.url, password=sink_conf.password, username=sink_conf.username, tls=sink_conf.tls) if cluster else None
    primaries = _redis_primaries(conf, sink_conf, topology)
    try:
        note = primaries[0].memory.listpack_note
        if note:  # a least-privilege user: say what the projection assumed
            summary.warnings.append(note)
        specs = tf.feature_specs(source)
        # Project growth from an encoded random sample (small: it comes to the driver).
        fraction = min(1.0, 2.0 * conf.redis.sample_entities / max(1, summary.entities))
        sample = good.sample(fraction=fraction, seed=17).limit(conf.redis.sample_entities).toArrow()
        rows: list[list] = []
        keys: list[bytes] = []
        if sample.num_rows:
            encoded = encode_batch(sample.combine_chunks().to_batches()[0], list(specs))
            columns = [c.to_pylist() for c in encoded.columns]
            ts = str(sink_conf.as_of).encode()
            keys = [(sink_conf.key_prefix + i).encode() for i in encoded.ids.to_pylist()]
            rows = [[col[i] for col in columns] + [ts] for i in range(len(keys))]
        projections = _project(conf, sink_conf, entity, summary.entities, primaries, keys, rows, topology)
        fullest = max(projections, key=lambda p: p.fill)
        summary.warnings.extend(fullest.warnings())
        stats: dict = {
            "mode": "cluster" if cluster else "standalone",
            "memory_before": sum(p.memory.used for p in primaries),
            "capacity": sum(p.capacity for p in primaries),
            "projected_growth": sum(p.projected_growth for p in projections),
            "predicted_encoding": fullest.predicted_encoding,
        }
        if cluster:
            stats["primaries"] = {
                p.node: {"memory_before": p.used_before, "capacity": p.capacity, "projected_growth": p.projected_growth, "projected_fill": round(p.fill, 4)}
                for p in projections
            }
        summary.sinks["redis"] = stats
        for projection in sorted(projections, key=lambda p: -p.fill):
            projection.check()  # raises CapacityError: nothing written
        guard_evictions = _check_eviction_policy(conf, entity, primaries, sink_conf, summary)

        ceilings = {p.address: int(p.capacity * conf.redis.hard_fill) for p in primaries}
        # baselines taken before any write: what every writer (whenever it starts) and the
        # check after the last write compare with
        before = {p.address or node_address(sink_conf.url): p.memory for p in primaries}
        plan = RedisWritePlan(
            sink=replace(
                redis_sink_config(conf, source, entity, date, min(ceilings.values()), url),
                cluster=cluster,
                node_ceilings=tuple((a, c) for a, c in ceilings.items() if a) if cluster else (),
                run_ids=tuple((a, m.run_id) for a, m in before.items()),
                evicted_keys=tuple((a, m.evicted_keys) for a, m in before.items()),
                stop_on_eviction=guard_evictions,
            ),
            features=specs,
            as_of_column=tf.AS_OF if tf.AS_OF in good.columns else None,
        )
        start = time.perf_counter()
        with progress(spark, f"write {source.name} to redis"):
            parts = good.mapInArrow(partial(write_redis_partition, plan), STATS_SCHEMA).collect()
        seconds = time.perf_counter() - start
        keys = ("entities", "skipped_newer", "values_set", "values_deleted", "non_finite", "bytes_sent", "round_trips", "retries", "redirects")
        _sum_partition_stats(stats, parts, keys, seconds, rate=("values_per_s", "values_set"))
        if stats["skipped_newer"]:
            summary.warnings.append(
                f"redis: {stats['skipped_newer']:,} entities already hold a newer snapshot of {source.name} than {date} "
                "and were left as they are"
            )
        errors = [from_wire(p["error_kind"], p["error"]) for p in parts if p["error"]]
        raise_first(
            errors,
            f"Redis write failed in {len(errors)} of {len(parts)} writer(s) after {stats['entities']:,} of "
            f"{summary.entities:,} entities were written (a rerun of the date writes them all again)",
        )
        stats["memory_after"] = _check_after_write(sink_conf, cluster, before, guard_evictions, stats)
        stopped = [p["stopped"] for p in parts if p["stopped"]]
        if stopped:
            capacity = f"{min(p.capacity for p in primaries):,} B" + (" per primary" if cluster else "")
            raise CapacityError(
                f"Redis write stopped at the memory ceiling (ours: {conf.redis.hard_fill:.0%} of {capacity}, or Redis's maxmemory): "
                f"{stats['entities']:,} of {summary.entities:,} entities ({stats['values_set']:,} values) were written "
                f"before {len(stopped)} writer(s) stopped; first: {stopped[0]}"
            )
        return stats
    finally:
        for p in primaries:
            p.client.close()


def _check_eviction_policy(conf: RunConf, entity: EntityDef, primaries: list[_Primary], sink_conf: RedisSinkConfig, summary: RunSummary) -> bool:
    """Refuse (or, with redis.eviction: warn, report) a server whose maxmemory-policy may
    evict this run's keys. Returns whether evictions during the write must fail it (not
    when every server's policy is volatile-* and the entity type has no TTL)."""
    ttl = bool(entity.ttl_seconds)
    # volatile-* evicts only keys with an expiry: keys of an entity type without a TTL are safe
    concerned = ttl or not all(p.memory.policy.startswith("volatile") for p in primaries)
    evicting = [p for p in primaries if p.memory.evicts(ttl)]
    if not evicting:
        return concerned
    where = ", ".join(f"{p.address or node_address(sink_conf.url)} ({p.memory.policy})" for p in evicting)
    text = (
        f"Redis maxmemory-policy may evict {entity.name} keys this run writes ({'any key' if 'allkeys' in where else 'keys with a TTL'}): {where}; "
        "evicted entities would read as missing. Set maxmemory-policy noeviction (the write then stops at maxmemory instead)"
    )
    if conf.redis.eviction == "refuse":
        raise CapacityError(f"refusing to write: {text}, or redis.eviction: warn to write anyway. Nothing was written.")
    summary.warnings.append(f"{text}. Writing anyway (redis.eviction: warn); the run fails if keys are evicted during it.")
    return True


def _check_after_write(sink_conf: RedisSinkConfig, cluster: bool, before: dict[str, MemoryInfo], guard_evictions: bool, stats: dict) -> int:
    """After the last write: no server restarted without persistence and none evicted keys
    since the baselines (a writer started after such an event could not tell). Returns
    used_memory of the primaries there are now (a failover replaced one)."""
    router = KeyRouter(sink_conf.url, cluster, password=sink_conf.password, username=sink_conf.username, tls=sink_conf.tls)
    try:
        addresses = router.topology.primaries if router.topology else [None]
        used = evicted = 0
        for address in addresses:
            info = router.client(address).info("memory", "stats", "server", "persistence")
            used += int(info["used_memory"])
            name = address or node_address(sink_conf.url)
            if name not in before:
                continue  # a promoted replica: the cluster writer checked its failover
            if str(info["run_id"]) != before[name].run_id and not int(info.get("aof_enabled", 0)):
                raise RedisRestarted(
                    f"Redis at {name} restarted during the run without persistence (AOF off): entities written before "
                    "the restart are gone; rerun the date"
                )
            evicted += max(0, int(info.get("evicted_keys", 0)) - before[name].evicted_keys)
    finally:
        router.close()
    stats["evicted_keys"] = evicted
    if evicted and guard_evictions:
        raise KeysEvicted(
            f"Redis evicted {evicted:,} key(s) during the write (maxmemory-policy): entities this run wrote may be gone; "
            "free memory or raise maxmemory, set maxmemory-policy noeviction, and rerun the date"
        )
    return used


def _project(conf: RunConf, sink_conf: RedisSinkConfig, entity: EntityDef, total: int, primaries: list[_Primary], keys: list[bytes], rows: list[list], topology: ClusterTopology | None) -> list[Projection]:
    """One projection per primary. In a cluster each gets its share of the entities: by the
    slots it owns or by the sample, whichever is larger (the safe side)."""
    common = dict(entity_type=entity.name, source_fields=[*sink_conf.fields, sink_conf.freshness_field], ttl=bool(entity.ttl_seconds), max_fill=conf.redis.max_fill)
    if topology is None:
        p = primaries[0]
        return [project_growth(p.client, keys=keys, rows=rows, total_entities=total, memory=p.memory, capacity=p.capacity, **common)]
    groups = topology.group(key_slots(keys)) if keys else {}
    out = []
    for p in primaries:
        mine = groups.get(p.address, [])
        share = max(topology.slots_of(p.address) / SLOTS, len(mine) / max(1, len(keys)))
        out.append(
            project_growth(
                p.client, keys=[keys[i] for i in mine], rows=[rows[i] for i in mine], total_entities=math.ceil(total * share),
                memory=p.memory, capacity=p.capacity, node=p.address, **common,
            )
        )
    # a primary with few sampled keys gets at least the whole sample's growth per entity
    sampled = sum(p.sampled for p in out)
    overall = sum(p.growth_per_entity * p.sampled for p in out) / sampled if sampled else 0.0
    for p in out:
        if p.growth_per_entity < overall:
            p.growth_per_entity = overall
            p.projected_growth = max(0, int(overall * p.total_entities))
    return out


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


def prepare_sql(conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, summary: RunSummary) -> SqlSinkConfig:
    """Driver side, before any store is written: connect, learn the dialect, check the
    entity table (created only when missing). A table the writer may not use stops the
    run here, with nothing written to either store."""
    sink_conf = sql_sink_config(conf, source, entity, date, "postgres")
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


def write_sql(spark: SparkSession, conf: RunConf, sink_conf: SqlSinkConfig, source: SourceDef, rows: DataFrame, summary: RunSummary) -> dict:
    """Pre-split (CockroachDB, large writes), then full-row upserts from inside the partitions."""
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
    _sum_partition_stats(stats, parts, keys, seconds, rate=("rows_per_s", "rows_upserted"))
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


def check_quality(
    spark: SparkSession, conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, prepared: Prepared, summary: RunSummary,
    *, expectations: bool, end: dt.date | None = None, docs_folder: str = "data_docs",
) -> None:
    """Profile the snapshot, run the expectations, apply the bad-row limit.

    Raises QualityGateError (BadInputError when only the bad-row limit is passed) before
    anything is written; warning-level failures only go to the summary.
    """
    failures: list[str] = []
    with progress(spark, f"quality checks {source.name}"):
        frame = quality.validation_frame(prepared.snapshot, source)
        summary.profile = quality.profile(frame, source)
        if expectations:
            # a range's size is not comparable with one date's: no row-count band then
            previous = None if end else quality.previous_success(conf.reports_path, source.name, date)
            checks = quality.derive_checks(source, entity, conf.quality, previous)
            docs = report_dir(conf, source.name, date, end) / docs_folder if conf.quality.data_docs else None
            result = quality.run_gate(frame, checks, suite_name=source.name, run_name=f"{source.name} {date}", docs_dir=docs)
            summary.expectations = result.as_dicts()
            summary.data_docs = result.data_docs
            summary.warnings.extend(f"expectation failed (warning): {r.describe()}" for r in result.warnings)
            failures = [r.describe() for r in result.blocking_failures]
    too_bad = summary.bad_fraction > conf.quality.max_bad_fraction
    bad_text = (
        f"{summary.bad_rows:,} of {summary.rows_read:,} rows are bad input ({summary.bad_fraction:.2%} > "
        f"quality.max_bad_fraction {conf.quality.max_bad_fraction:.2%}); reasons: {summary.bad_reasons}"
    )
    if failures:
        lines = failures + ([bad_text] if too_bad else [])
        docs_line = f"\n  report: {summary.data_docs}" if summary.data_docs else ""
        raise QualityGateError(
            f"source {source.name!r} {date}: {len(failures)} blocking expectation(s) failed; nothing was written:\n  " + "\n  ".join(lines) + docs_line
        )
    if too_bad:
        raise BadInputError(f"source {source.name!r} {date}: {bad_text}; nothing was written. Rows kept in {summary.quarantine_table or 'quarantine (not written by validate)'}")


def verify_writes(conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, good: DataFrame, summary: RunSummary, redis_url: str | None) -> None:
    """Read a random sample back from every store written; any difference fails the run."""
    rows = verify.sample_rows(good, conf.quality.verify_sample, summary.entities)
    found = []
    if "redis" in summary.sinks:
        sink_conf = redis_sink_config(conf, source, entity, date, None, redis_url)
        found.append(verify.verify_redis(replace(sink_conf, cluster=is_redis_cluster(conf, sink_conf)), source, rows))
    if "cockroach" in summary.sinks:
        found.append(verify.verify_sql(sql_sink_config(conf, source, entity, date, summary.sinks["cockroach"]["dialect"]), source, rows))
    for m in found:
        summary.verification[m.sink] = {"checked": len(rows), "newer": m.newer, "mismatches": m.count, "listed": m.listed}
    wrong = [m for m in found if m.count]
    if wrong:
        total = sum(m.count for m in wrong)
        raise quality.VerificationError(
            f"source {source.name!r} {date}: {total:,} value(s) read back differ from the source "
            f"({', '.join(f'{m.sink}: {m.count:,}' for m in wrong)}); first: {wrong[0].listed[0]}"
        )


class _Step:
    """Times one source's run or validation, records its outcome, always writes the report."""

    def __init__(self, summary: RunSummary, report: Path | None, done: str):
        self.summary, self.report, self.done = summary, report, done
        self.prepared: Prepared | None = None

    def __enter__(self) -> _Step:
        self.start = time.perf_counter()
        return self

    def __exit__(self, kind, exc, tb) -> None:
        summary = self.summary
        if exc is None:
            summary.status = self.done
        else:
            summary.status = "failed"
            summary.error = f"{type(exc).__name__}: {exc}"
        if self.prepared:
            for df in self.prepared.cached:
                df.unpersist()
        if self.report:
            with summary.stage("report"):
                summary.seconds = time.perf_counter() - self.start
                summary.write_json(self.report)  # its own time is the one the file cannot hold
        summary.seconds = time.perf_counter() - self.start


def _new_summary(conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date) -> RunSummary:
    return RunSummary(source=source.name, entity=entity.name, date=date.isoformat(), env=conf.env, as_of=as_of_epoch(date))


def run_source(
    spark: SparkSession,
    conf: RunConf,
    defs: Definitions,
    source_name: str,
    date: dt.date,
    *,
    redis_url: str | None = None,
    report: bool = True,
    after_write: Callable[[RunSummary], None] | None = None,
    end: dt.date | None = None,
) -> RunSummary:
    """Materialize one source for one date; the summary is written even on failure.

    With ``end``, the dates ``date``..``end`` in one pass: each entity's latest good row
    (see :func:`prepare`). ``after_write`` runs between the writes and their verification
    (for integrations that want to act on a written snapshot, and for tests).
    """
    source = defs.source(source_name)
    entity = defs.entity_of(source)
    summary = _new_summary(conf, source, entity, end or date)
    if end:
        summary.date = f"{date.isoformat()}..{end.isoformat()}"
    report_file = report_dir(conf, source.name, date, end) / "summary.json"
    with _Step(summary, report_file if report else None, "succeeded") as step:
        with progress(spark, f"check {source.name}"):
            with summary.stage("prepare"):
                step.prepared = prepared = prepare(spark, conf, source, entity, date, summary, end)
            with summary.stage("quarantine"):
                write_quarantine(conf, source, date, prepared.quarantine, summary, end)
        with summary.stage("gate"):
            check_quality(spark, conf, source, entity, date, prepared, summary, expectations=conf.quality.expectations, end=end)
        sql_sink = None
        if "cockroach" in conf.sinks:
            with summary.stage("sql checks"):  # before either store is written
                sql_sink = prepare_sql(conf, source, entity, date, summary)
        if "redis" in conf.sinks:
            with summary.stage("write redis"):
                write_redis(spark, conf, source, entity, date, prepared.good, summary, redis_url)
        if sql_sink:
            with summary.stage("write cockroach"):
                write_sql(spark, conf, sql_sink, source, prepared.sql_good, summary)
        if after_write:
            after_write(summary)
        if conf.quality.verify_sample:
            with summary.stage("verify"):
                verify_writes(conf, source, entity, date, prepared.good, summary, redis_url)
    return summary


def validate_source(spark: SparkSession, conf: RunConf, defs: Definitions, source_name: str, date: dt.date) -> RunSummary:
    """The checks of a run without any write: status 'passed' or 'failed', report in validation.json."""
    source = defs.source(source_name)
    entity = defs.entity_of(source)
    summary = _new_summary(conf, source, entity, date)
    with _Step(summary, report_dir(conf, source.name, date) / "validation.json", "passed") as step:
        with progress(spark, f"check {source.name}"), summary.stage("prepare"):
            step.prepared = prepared = prepare(spark, conf, source, entity, date, summary)
            count_reasons(prepared.quarantine, summary)
        with summary.stage("gate"):
            check_quality(spark, conf, source, entity, date, prepared, summary, expectations=True, docs_folder="validate_docs")
    return summary


def verify_source(spark: SparkSession, conf: RunConf, defs: Definitions, source_name: str, date: dt.date, *, redis_url: str | None = None) -> RunSummary:
    """Read back a sample of the date's snapshot from every configured store and compare it
    with the source rows (what a run does after writing), without writing; verification.json."""
    source = defs.source(source_name)
    entity = defs.entity_of(source)
    summary = _new_summary(conf, source, entity, date)
    with _Step(summary, report_dir(conf, source.name, date) / "verification.json", "verified") as step:
        with progress(spark, f"read {source.name}"):
            step.prepared = prepared = prepare(spark, conf, source, entity, date, summary)
        if "redis" in conf.sinks:
            summary.sinks["redis"] = {}
        if "cockroach" in conf.sinks:
            with sql_connect(sql_sink_config(conf, source, entity, date, "postgres")) as conn:
                summary.sinks["cockroach"] = {"dialect": detect_dialect(conn) if conf.sql.dialect == "auto" else conf.sql.dialect}
        verify_writes(conf, source, entity, date, prepared.good, summary, redis_url)
    return summary


def partition_rows(spark: SparkSession, conf: RunConf, source: SourceDef, date: dt.date) -> int:
    """Whether the source has rows for ``date`` (0 or 1: stops at the first row)."""
    try:
        raw = read_source(spark, conf, source)
    except SourceNotFound:
        return 0
    return raw.where(F.col(source.date_column) == F.lit(date)).limit(1).count()


def report_dir(conf: RunConf, source: str, date: dt.date, end: dt.date | None = None) -> Path:
    """reports/<source>/<date>/ (a range: <start>_<end>/): summary.json, validation.json, data_docs/."""
    return conf.reports_path / source / (f"{date.isoformat()}_{end.isoformat()}" if end else date.isoformat())


def report_path(conf: RunConf, source: str, date: dt.date) -> Path:
    return report_dir(conf, source, date) / "summary.json"
