"""Stale-field cleanup: delete the Redis fields of features an entity type no longer has
(here), and clean the SQL store's entity table (sql.py: expired rows, rows of removed
sources, JSON keys of removed features), recorded as one ledger step.

No SCAN of the keyspace (the job's Redis user may not). Everything comes from the ledger:
the steps that wrote to this Redis, with the field names no cleanup has removed since;
a name no current feature or freshness field uses is stale. The keys to visit are those
steps' entity keys, read again by Spark from the tables and dates the steps recorded
(the source's definition may be gone). Each source is cleaned on its own keys: each
partition sends pipelined HDELs in bounded chunks, at a bounded rate. The ledger records a
source as cleaned only when all its keys were found and visited; what could not be found
is reported and left for a later cleanup.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import partial, reduce
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from feature_defs import Definitions, EntityDef, SourceDef
from fm_config import RunConf
from jobs import transforms as tf
from jobs.operations.cleanup.sql import SqlCleanupPlan, SqlCleanupResult, clean_sql
from jobs.operations.ledger.events import Entry, Ledger, RedisWrite, config_hash, keys_from, redis_target
from jobs.pipeline.source_table import (
    CatalogNotConfigured,
    CatalogUnavailable,
    SourceNotFound,
    SourceUnreadable,
    TableRef,
    on_dates,
    open_table,
)
from serializers import field_id, freshness_field_name, subsecond_field_name
from serializers.keys import FRESHNESS_PREFIX, SUBSECOND_PREFIX, redis_key
from sinks.redis.config import RedisSinkConfig, redis_sink_config
from sinks.redis.preflight import detect_cluster
from sinks.redis.router import KeyRouter

CLEANUP_STATS = "keys long, fields_removed long, round_trips long"


class CleanupIncomplete(RuntimeError):
    """Some stale fields were not deleted: their keys could not be found (or the cleanup stopped)."""


@dataclass
class SourceCleanup:
    """The stale fields one source wrote, and the keys it wrote them to."""

    source: str
    fields: list[str]
    """Its features no longer defined, then its freshness field when the source is gone."""
    steps: list[str]
    """Run ids of the write steps whose keys are visited."""
    tables: list[str] = field(default_factory=list)
    keys: int = 0
    """Distinct keys found in those steps' tables and dates."""
    left: list[str] = field(default_factory=list)
    """Why some of its keys cannot be found; then it is not recorded as cleaned."""

    def describe(self) -> str:
        steps = f"{len(self.steps)} write step" + "s" * (len(self.steps) != 1)
        return f"{self.source}: {', '.join(self.fields)} on {self.keys:,} keys (from {', '.join(self.tables) or 'no table'}, {steps})"


@dataclass
class CleanupPlan:
    entity: str
    parts: list[SourceCleanup] = field(default_factory=list)
    """Per source that wrote stale fields."""
    target: str = ""
    """The Redis cleaned (URL and namespace, no secrets)."""
    legacy_cleanups: list[dt.date] = field(default_factory=list)
    """Start dates of cleanups recorded without what they did: their fields are planned again."""

    @property
    def removed_sources(self) -> list[str]:
        """Sources no longer defined: their freshness fields go too."""
        return [p.source for p in self.parts if freshness_field_name(p.source) in p.fields]

    @property
    def removed_features(self) -> list[str]:
        return sorted({n for p in self.parts for n in p.fields if n != freshness_field_name(p.source)})

    @property
    def fields(self) -> list[str]:
        """Names whose field ids are deleted: stale features and stale freshness fields."""
        return self.removed_features + [freshness_field_name(s) for s in self.removed_sources]

    @property
    def keys(self) -> int:
        return sum(p.keys for p in self.parts)

    @property
    def left(self) -> list[SourceCleanup]:
        return [p for p in self.parts if p.left]

    def describe(self) -> str:
        lines = [f"cleanup of entity {self.entity}" + (f" in {self.target}" if self.target else "")]
        lines.append(f"  features no longer defined: {', '.join(self.removed_features) or 'none'}")
        if self.removed_sources:
            lines.append(f"  sources no longer defined (their freshness fields go): {', '.join(self.removed_sources)}")
        lines += [f"  {p.describe()}" for p in self.parts]
        lines += [
            f"  cannot clean {p.source} on every key it wrote: {'; '.join(p.left)} (keys are never SCANned: left for a later cleanup)"
            for p in self.left
        ]
        if self.legacy_cleanups:
            days = ", ".join(sorted({str(d) for d in self.legacy_cleanups}))
            lines.append(f"  note: cleanups of {days} did not record which keys they visited: their fields are checked again")
        lines.append(f"  keys to visit: {self.keys:,}")
        return "\n".join(lines)


@dataclass(frozen=True)
class CleanupWriter:
    redis: RedisSinkConfig
    """Where and how to connect (the Redis sink's config), and the entity type's key prefix."""
    fields: tuple[bytes, ...]
    """The stale fields to delete."""
    keys_per_second: float | None


def cleanup_partition(plan: CleanupWriter, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """HDEL the stale fields from this partition's keys, a chunk per round trip, rate-limited."""
    router = KeyRouter(plan.redis, plan.redis.cluster)
    chunk_keys, prefix = plan.redis.chunk_entities, plan.redis.key_prefix
    keys = removed = trips = 0
    start = time.monotonic()
    try:
        for batch in batches:
            ids = batch.column(tf.ENTITY_ID).to_pylist()
            for i in range(0, len(ids), chunk_keys):
                chunk = [redis_key(prefix, entity_id) for entity_id in ids[i : i + chunk_keys]]
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


def table_keys(
    spark: SparkSession, conf: RunConf, entity: EntityDef, where: dict[str, Any], writes: list[RedisWrite]
) -> tuple[DataFrame | None, str | None]:
    """Distinct entity ids (as in the Redis key) of the rows these steps wrote from one table,
    and what keeps some of them from being found (None when all can be)."""
    ref, columns, day_column = TableRef.from_record(where), where["key_columns"], where.get("date_column")
    try:
        table = open_table(spark, conf, ref)
    except (SourceNotFound, SourceUnreadable, CatalogUnavailable, CatalogNotConfigured) as exc:
        return None, str(exc)
    missing = [c for c in columns if c not in table.columns]
    if missing or len(columns) != len(entity.keys):
        return (
            None,
            f"{ref}: key columns {', '.join(columns)} ({', '.join(missing) or 'present'}) "
            f"do not match entity {entity.name}'s {len(entity.keys)} key parts",
        )
    problem = None
    # Without a date column or a recorded range every row is read: a superset of the keys written.
    if day_column in table.columns and all(w.dates is not None or w.start_date for w in writes):
        exact = sorted({d for w in writes if w.dates is not None for d in w.dates})
        ranges = [(w.start_date, w.end_date or w.start_date) for w in writes if w.dates is None]
        try:
            table = on_dates(table, day_column, exact, ranges)
        except tf.SchemaDriftError as exc:
            return None, f"{ref}: {exc}"
        if exact:
            present = {r[0] for r in on_dates(table, day_column, exact).select(tf.col(day_column)).distinct().collect()}
            gone = [str(d) for d in exact if d not in present]
            if gone:
                problem = f"{ref} no longer holds the dates {', '.join(gone)} that were written from it"
    keyed = SourceDef.model_construct(key_columns=list(columns))  # the key transforms read only the key columns
    tagged = tf.tag_key_problems(table, keyed, entity)
    return tf.with_entity_id(tagged.where(~tf.is_bad(tagged)), keyed, entity).select(tf.ENTITY_ID), problem


def source_keys(
    spark: SparkSession, conf: RunConf, entity: EntityDef, defined: SourceDef | None, writes: list[RedisWrite], part: SourceCleanup
) -> DataFrame | None:
    """The distinct keys the steps of one source wrote; what cannot be found goes to ``part.left``."""
    by_table: dict[str, list[RedisWrite]] = {}
    unrecorded = 0
    for w in writes:
        # steps recorded before the ledger kept keys_from: the source's current definition, if any
        where = w.keys_from or (keys_from(conf, defined, entity) if defined else None)
        if where is None:
            unrecorded += 1
            continue
        by_table.setdefault(json.dumps(where, sort_keys=True), []).append(w)
    if unrecorded:
        part.left.append(
            f"{unrecorded} of its steps were recorded without the table their keys come from, and the source is no longer defined"
        )
    frames = []
    for where, group in by_table.items():
        location = json.loads(where)
        frame, problem = table_keys(spark, conf, entity, location, group)
        if problem:
            part.left.append(problem)
        if frame is not None:
            frames.append(frame)
            part.tables.append(str(TableRef.from_record(location)))
    return reduce(DataFrame.unionByName, frames).distinct() if frames else None


def plan_cleanup(
    spark: SparkSession, conf: RunConf, defs: Definitions, ledger: Ledger, entity_name: str, redis_url: str | None = None
) -> tuple[CleanupPlan, dict[str, DataFrame]]:
    """The stale fields per source and the keys to visit for each (persisted: unpersist them when done)."""
    entity = defs.entity(entity_name)
    target = redis_target(conf, redis_url)
    writes, legacy = ledger.redis_writes(entity.name, target)
    current_sources = {s.name: s for s in defs.sources.values() if s.entity == entity.name}
    # A name whose field id a current feature or freshness field shares would delete live data: never stale.
    live_ids = {field_id(f.stored_name) for s in current_sources.values() for f in s.features} | {
        field_id(name) for s in current_sources for name in (freshness_field_name(s), subsecond_field_name(s))
    }
    stale_by_source: dict[str, list[tuple[RedisWrite, set[str]]]] = {}
    for w in writes:
        stale = {n for n in w.names if field_id(n) not in live_ids}
        if stale:
            stale_by_source.setdefault(w.source, []).append((w, stale))
    parts, keys = [], {}
    for name, found in sorted(stale_by_source.items()):
        stale = set().union(*(names for _, names in found))
        freshness = freshness_field_name(name)
        part = SourceCleanup(
            name, sorted(stale - {freshness}) + ([freshness] if freshness in stale else []), sorted(w.run_id for w, _ in found)
        )
        frame = source_keys(spark, conf, entity, current_sources.get(name), [w for w, _ in found], part)
        if frame is not None:
            keys[name] = frame.persist()
            part.keys = keys[name].count()
        parts.append(part)
    stale_names = {n for p in parts for n in p.fields}
    legacy_days = [r["start_date"] for r in legacy if set(r["features"] or []) & stale_names]
    return CleanupPlan(entity=entity.name, parts=parts, target=target, legacy_cleanups=legacy_days), keys


def _field_ids(names: list[str]) -> tuple[bytes, ...]:
    """The field ids to delete: of a removed source, its sub-second field beside its freshness
    field (written by event-time sources, never recorded by name in the ledger)."""
    subsecond = [SUBSECOND_PREFIX + n.removeprefix(FRESHNESS_PREFIX) for n in names if n.startswith(FRESHNESS_PREFIX)]
    return tuple(field_id(name) for name in [*names, *subsecond])


def run_cleanup(conf: RunConf, entity: EntityDef, plan: CleanupPlan | SourceCleanup, keys: DataFrame, redis_url: str | None = None) -> dict:
    """Delete the plan's fields from its keys; returns counts and Redis memory before/after."""
    redis = redis_sink_config(conf, entity=entity, url=redis_url)
    redis = replace(redis, cluster=detect_cluster(conf.redis, redis))
    writer = CleanupWriter(redis, fields=_field_ids(plan.fields), keys_per_second=conf.redis.cleanup_keys_per_second)
    servers = KeyRouter(redis, redis.cluster)
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


@dataclass
class CleanupResult:
    """What a cleanup did, per source: the ledger's record of it."""

    cleaned: dict[str, dict] = field(default_factory=dict)
    """Sources whose stale fields are gone from every key they were written to."""
    left: dict[str, dict] = field(default_factory=dict)
    """Sources with stale fields that may remain on some keys, and why."""
    memory_before: int | None = None
    memory_after: int | None = None
    seconds: float = 0.0
    error: Exception | None = None
    sql: SqlCleanupResult | None = None
    """The SQL store's part, when it was cleaned."""

    @property
    def keys(self) -> int:
        return sum(d["keys"] for d in (*self.cleaned.values(), *self.left.values()))

    @property
    def fields_removed(self) -> int:
        return sum(d["fields_removed"] for d in (*self.cleaned.values(), *self.left.values()))

    def incomplete(self) -> Exception | None:
        """The error to record: the one that stopped the cleanup, or what was left."""
        if self.error is not None:
            return self.error
        left = [f"{s} ({', '.join(d['fields'])}): {d['reason']}" for s, d in sorted(self.left.items())]
        if self.sql is not None and self.sql.error is not None:
            left.append(f"SQL table {self.sql.table}: {type(self.sql.error).__name__}: {self.sql.error}")
        return CleanupIncomplete("not cleaned: " + "; ".join(left)) if left else None


def clean(conf: RunConf, entity: EntityDef, plan: CleanupPlan, keys: dict[str, DataFrame], redis_url: str | None = None) -> CleanupResult:
    """Run the plan source by source. A source some of whose keys cannot be found is still
    cleaned on those that can, but left; an error stops the cleanup, keeping what was done."""
    result = CleanupResult()
    for part in plan.parts:
        done = {"fields": part.fields, "keys": 0, "fields_removed": 0}
        if result.error is not None:
            result.left[part.source] = {**done, "reason": "not reached: the cleanup stopped at an error"}
            continue
        if part.keys:
            try:
                stats = run_cleanup(conf, entity, part, keys[part.source], redis_url)
            except Exception as exc:
                result.error = exc
                result.left[part.source] = {**done, "reason": f"{type(exc).__name__}: {exc}"}
                continue
            done |= {"keys": stats["keys"], "fields_removed": stats["fields_removed"]}
            result.memory_before = stats["memory_before"] if result.memory_before is None else result.memory_before
            result.memory_after, result.seconds = stats["memory_after"], result.seconds + stats["seconds"]
        if part.left:
            result.left[part.source] = {**done, "reason": "; ".join(part.left)}
        else:
            result.cleaned[part.source] = {**done, "steps": part.steps}
    return result


def recorded_cleanup(
    conf: RunConf,
    defs: Definitions,
    ledger: Ledger,
    plan: CleanupPlan,
    keys: dict[str, DataFrame],
    redis_url: str | None = None,
    sql_plan: SqlCleanupPlan | None = None,
) -> CleanupResult:
    """clean() (Redis, when the plan has a target) and clean_sql() (when given), with a ledger
    entry that records only what was done: the sources cleaned in Redis (with the steps whose
    keys were visited), what was left and why, for a later cleanup, and the SQL store's counts."""
    today = dt.datetime.now(dt.UTC).date()
    targets = ({"redis": plan.target} if plan.target else {}) | ({"sql": sql_plan.target} if sql_plan else {})
    entry = ledger.start(
        Entry(kind="cleanup", source=None, entity=plan.entity, start_date=today, end_date=today, sinks=list(targets),
              definitions_hash=defs.digest, config_hash=config_hash(conf), features=plan.fields, targets=targets)
    )  # fmt: skip
    result = clean(conf, defs.entities[plan.entity], plan, keys, redis_url)
    if sql_plan is not None:
        result.sql = clean_sql(conf, sql_plan)
    entry.features = [n for done in result.cleaned.values() for n in done["fields"]]
    entry.entities = result.keys
    entry.written = {"redis": {"keys": result.keys, "fields_removed": result.fields_removed}} if plan.target else {}
    entry.cleanup = {"cleaned": result.cleaned, "left": result.left}
    if result.sql is not None:
        entry.written["sql"] = {"rows_deleted": result.sql.rows_deleted, "keys_removed": result.sql.keys_removed_total}
        entry.cleanup["sql"] = result.sql.record()
    ledger.finish(entry, error=result.incomplete())
    return result
