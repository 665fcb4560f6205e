"""Stale-field cleanup: delete the Redis fields of features an entity type no longer has.

No SCAN of the keyspace. Which fields are stale comes from the ledger: every feature a
succeeded step wrote for the entity type, minus the features defined now (and the
freshness fields of sources that are gone). Which keys to visit comes from the entity
keys in the sources' ETL tables, read by Spark; each partition sends pipelined HDELs in
bounded chunks, at a bounded rate.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial, reduce

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from feature_defs import Definitions, EntityDef
from jobs import transforms as tf
from jobs.config import RunConf
from jobs.ledger import Ledger
from jobs.run import is_redis_cluster, key_prefix, read_source, redis_tls
from serializers import field_id, freshness_field_name
from sinks.redis_cluster import KeyRouter
from sinks.redis_sink import RedisTls

CLEANUP_STATS = "keys long, fields_removed long, round_trips long"


@dataclass
class CleanupPlan:
    entity: str
    removed_features: list[str]
    removed_sources: list[str]
    sources_read: list[str]
    keys: int = 0

    @property
    def fields(self) -> list[str]:
        """Names whose field ids are deleted: stale features and stale freshness fields."""
        return self.removed_features + [freshness_field_name(s) for s in self.removed_sources]

    def describe(self) -> str:
        lines = [f"cleanup of entity {self.entity}"]
        lines.append(f"  features no longer defined: {', '.join(self.removed_features) or 'none'}")
        if self.removed_sources:
            lines.append(f"  sources no longer defined (their freshness fields go): {', '.join(self.removed_sources)}")
        lines.append(f"  keys to visit: {self.keys:,} (entity keys in {', '.join(self.sources_read) or 'no source table'})")
        return "\n".join(lines)


@dataclass(frozen=True)
class CleanupWriter:
    url: str
    key_prefix: str
    fields: tuple[bytes, ...]
    chunk_keys: int
    keys_per_second: float | None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: RedisTls | None = None
    cluster: bool = False


def cleanup_partition(plan: CleanupWriter, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """HDEL the stale fields from this partition's keys, a chunk per round trip, rate-limited."""
    router = KeyRouter(plan.url, plan.cluster, password=plan.password, username=plan.username, tls=plan.tls)
    keys = removed = trips = 0
    start = time.monotonic()
    try:
        for batch in batches:
            ids = batch.column(tf.ENTITY_ID).to_pylist()
            for i in range(0, len(ids), plan.chunk_keys):
                chunk = [(plan.key_prefix + entity_id).encode() for entity_id in ids[i : i + plan.chunk_keys]]
                removed += sum(router.run(chunk, lambda pipe, key: pipe.hdel(key, *plan.fields)))
                keys += len(chunk)
                trips += 1
                if plan.keys_per_second:
                    # stay under the rate: sleep until this many keys are due
                    ahead = keys / plan.keys_per_second - (time.monotonic() - start)
                    if ahead > 0:
                        time.sleep(ahead)
    finally:
        router.close()
    yield pa.RecordBatch.from_pylist([{"keys": keys, "fields_removed": removed, "round_trips": trips}])


def entity_keys(spark: SparkSession, conf: RunConf, defs: Definitions, entity: EntityDef) -> tuple[DataFrame | None, list[str]]:
    """Distinct entity ids (as in the Redis key) over every date of the entity's source tables."""
    frames, names = [], []
    for source in (s for s in defs.sources.values() if s.entity == entity.name):
        raw = read_source(spark, conf, source)
        tagged = tf.tag_key_problems(raw, source, entity)
        usable = tagged.where(~tf.is_bad(tagged))
        frames.append(tf.with_entity_id(usable, source, entity).select(tf.ENTITY_ID))
        names.append(source.name)
    if not frames:
        return None, names
    return reduce(DataFrame.unionByName, frames).distinct(), names


def plan_cleanup(spark: SparkSession, conf: RunConf, defs: Definitions, ledger: Ledger, entity_name: str) -> tuple[CleanupPlan, DataFrame | None]:
    entity = defs.entities.get(entity_name)
    if entity is None:
        raise KeyError(f"unknown entity {entity_name!r} (defined: {', '.join(sorted(defs.entities))})")
    recorded = ledger.recorded_features(entity.name)
    current_sources = {s.name: s for s in defs.sources.values() if s.entity == entity.name}
    current = {f.name for s in current_sources.values() for f in s.features}
    written = set().union(*recorded.values()) if recorded else set()
    # A removed name whose field id a current feature shares would delete live data: keep it.
    live_ids = {field_id(n) for n in current} | {field_id(freshness_field_name(s)) for s in current_sources}
    keys, names = entity_keys(spark, conf, defs, entity)
    plan = CleanupPlan(
        entity=entity.name,
        removed_features=sorted(n for n in written - current if field_id(n) not in live_ids),
        removed_sources=sorted(s for s in set(recorded) - set(current_sources) if field_id(freshness_field_name(s)) not in live_ids),
        sources_read=names,
    )
    if keys is not None and plan.fields:
        keys = keys.persist()
        plan.keys = keys.count()
    return plan, keys


def run_cleanup(conf: RunConf, entity: EntityDef, plan: CleanupPlan, keys: DataFrame, redis_url: str | None = None) -> dict:
    """Delete the plan's fields from its keys; returns counts and Redis memory before/after."""
    password = conf.redis_password()
    writer = CleanupWriter(
        url=redis_url or conf.redis.url,
        key_prefix=key_prefix(entity, conf.redis.namespace),
        fields=tuple(field_id(name) for name in plan.fields),
        chunk_keys=conf.redis.pipeline_entities,
        keys_per_second=conf.redis.cleanup_keys_per_second,
        username=conf.redis.username,
        password=password.get_secret_value() if password else None,
        tls=redis_tls(conf),
    )
    writer = replace(writer, cluster=is_redis_cluster(conf, writer))
    servers = KeyRouter(writer.url, writer.cluster, password=writer.password, username=writer.username, tls=writer.tls)
    try:
        before = servers.used_memory()
        start = time.perf_counter()
        parts = keys.mapInArrow(partial(cleanup_partition, writer), CLEANUP_STATS).collect()
        seconds = time.perf_counter() - start
        after = servers.used_memory()
    finally:
        servers.close()
    stats = {k: sum(p[k] for p in parts) for k in ("keys", "fields_removed", "round_trips")}
    return {**stats, "memory_before": before, "memory_after": after, "memory_freed": max(0, before - after), "seconds": seconds}
