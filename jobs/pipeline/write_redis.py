"""Stage 5, write to Redis: the store's preflight on the driver (sinks/redis/preflight.py),
the write from inside the partitions, the check after it."""

from __future__ import annotations

import time
from functools import partial

import pyarrow as pa
from pyspark.sql import DataFrame

from jobs import transforms as tf
from jobs.pipeline.context import RunContext
from jobs.pipeline.report.summary import RunSummary
from jobs.pipeline.snapshot_order import future_warning, newer_kept
from jobs.pipeline.store_record import redis_after
from jobs.progress import progress
from serializers.description import Description
from sinks.errors import CapacityError, from_wire, raise_first
from sinks.partition import partition_schema, sum_partition_stats, write_partition
from sinks.redis.description import record_description
from sinks.redis.preflight import check_after_write, preflight

_SUMMED = (
    "entities",
    "skipped_newer",
    "replaced_future",
    "values_set",
    "values_deleted",
    "non_finite",
    "bytes_sent",
    "round_trips",
    "retries",
    "redirects",
    "unreachable",
)


def write_redis(ctx: RunContext, good: DataFrame, summary: RunSummary, described: Description | None = None) -> dict:
    """Check the servers (capacity, eviction policy), take the baselines, record what the
    entity type's hashes hold (``described``: jobs/pipeline/describe.py), write from inside
    the partitions, then check the servers again. Returns the summary's Redis stats."""
    summary.sinks["redis"] = stats = {}
    sample = _sample(ctx, good, summary.entities)
    checked = preflight(
        ctx.conf.redis,
        ctx.redis_config(),
        ctx.entity,
        tf.feature_specs(ctx.source),
        entities=summary.entities,
        sample=sample,
        as_of_column=tf.AS_OF if tf.AS_OF in good.columns else None,
        report=stats,
        warnings=summary.warnings,
    )
    if described:
        record_description(checked.plan.sink, described, cluster=checked.plan.sink.cluster)
        stats["described"] = len(described)
    start = time.perf_counter()
    with progress(ctx.spark, f"write {ctx.source.name} to redis"):
        parts = good.mapInArrow(partial(write_partition, checked.plan), partition_schema(checked.plan)).collect()
    _sum_writers(ctx, parts, time.perf_counter() - start, stats, summary)
    stats["memory_after"] = check_after_write(checked.plan.sink, checked.baselines, checked.guard_evictions, stats)
    stats["store"] = redis_after(checked.plan.sink, sample, summary)
    stopped = [p["stopped"] for p in parts if p["stopped"]]
    if stopped:
        raise CapacityError(
            "Redis write stopped at the memory ceiling "
            f"(ours: {ctx.conf.redis.hard_fill:.0%} of {checked.capacity_text}, or Redis's maxmemory): "
            f"{stats['entities']:,} of {summary.entities:,} entities ({stats['values_set']:,} values) were written "
            f"before {len(stopped)} writer(s) stopped; first: {stopped[0]}"
        )
    return stats


def _sample(ctx: RunContext, good: DataFrame, entities: int) -> pa.Table:
    """A random sample of the rows (small: it comes to the driver), to project memory growth."""
    size = ctx.conf.redis.sample_entities
    return good.sample(fraction=min(1.0, 2.0 * size / max(1, entities)), seed=17).limit(size).toArrow()


def _sum_writers(ctx: RunContext, parts: list, seconds: float, stats: dict, summary: RunSummary) -> None:
    """Add up the writers' stats; fail with their errors, rebuilt as their classes."""
    sum_partition_stats(stats, parts, _SUMMED, seconds, rate=("values_per_s", "values_set"))
    if stats["skipped_newer"]:
        summary.warnings.append(newer_kept(ctx, "redis", stats["skipped_newer"], "entities"))
    if stats["replaced_future"]:
        summary.warnings.append(future_warning("redis", stats["replaced_future"], "entities", ctx))
    errors = [from_wire(p["error_kind"], p["error"]) for p in parts if p["error"]]
    raise_first(
        errors,
        f"Redis write failed in {len(errors)} of {len(parts)} writer(s) after {stats['entities']:,} of "
        f"{summary.entities:,} entities were written"
        + (f", {stats['unreachable']:,} not (their primary was down)" if stats["unreachable"] else "")
        + " (a rerun of the date writes them all again)",
    )
