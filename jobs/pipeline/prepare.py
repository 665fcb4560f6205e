"""Stage 2, prepare: one date (or range) of the source, de-duplicated and checked, split into
rows to write and rows to quarantine, with the counts the summary reports."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from jobs import event_time
from jobs import transforms as tf
from jobs.pipeline import shared_cache
from jobs.pipeline.context import RunContext
from jobs.pipeline.source_table import dated


@dataclass(frozen=True)
class SnapshotCounts:
    """What prepare counted, for the summary (same names as its fields)."""

    rows_read: int = 0
    bad_rows: int = 0
    ignored_rows: int = 0
    superseded_rows: int = 0
    earlier_dates: int = 0
    entities: int = 0
    snapshot_entities: int = 0
    conflicting_keys: int = 0
    tied_keys_kept: int = 0


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
    counts: SnapshotCounts
    share_key: str = ""
    """Sources of the run that prepare the same rows alike share the cached frames (shared_cache.py)."""
    released: bool = field(default=False, repr=False)

    def release(self) -> None:
        """Done with the cached frames: unpersisted once no other source reads them (once per prepare)."""
        if not self.released:
            self.released = True
            shared_cache.release(self.share_key)


def prepare(ctx: RunContext, raw: DataFrame) -> Prepared:
    """Split the date's snapshot of ``raw`` (the read source) into rows to write and rows to quarantine.

    With ``ctx.end``, a range of dates: each date is de-duplicated and checked on its own, and
    each entity's good row of its latest date is written, with that date's as-of time
    (the state that applying the dates in order would leave).

    With ``ctx.window`` (select_by event_time), the rows of that window instead: each
    entity's latest by event time, written as of that event time (jobs/event_time.py).

    With the SQL sink in the run, each row's JSON object is built here, so an object over
    ``sql.max_map_bytes`` is bad input like any other: quarantined, written to no store.
    """
    key = shared_cache.share_key(ctx.source, ctx.entity, ctx.date, ctx.end, ctx.window, stored_names="sql" in ctx.conf.sinks)
    shared_cache.hold(key)
    try:
        return _prepare(ctx, raw, key)
    except BaseException:
        shared_cache.release(key)
        raise


def _prepare(ctx: RunContext, raw: DataFrame, key: str) -> Prepared:
    conf, source, entity = ctx.conf, ctx.source, ctx.entity
    if ctx.window is not None:  # select_by event_time: the rows of the window, and those without an event time
        snapshot = event_time.in_window(raw, source, ctx.window)
    else:
        snapshot = dated(raw, source.date_column, ctx.date, ctx.end)
    # The plan carries the share key (the filter is always true, and optimized away): Spark
    # shares one cache entry among equal plans, which sources of the run with this key have.
    snapshot = snapshot.where(F.lit(key).isNotNull())
    tagged = tf.tag_key_problems(snapshot, source, entity)
    if ctx.window is not None:
        tagged = event_time.tag_null_event_time(tagged, source)
    tagged = shared_cache.cache(key, tagged)
    read = shared_cache.counted(key, "read", lambda: _count_read(ctx, tagged))
    good_rows = tagged.where(~tf.is_bad(tagged))
    unique = read["duplicates"] == 0
    if not unique:
        # Partitions by entity key, as many as the size needs: each task's share (and the cached
        # blocks) stays the same size however large the snapshot; the de-duplication reuses it.
        partitions = max(conf.spark.shuffle_partitions, math.ceil(read["rows"] / conf.spark.rows_per_partition))
        good_rows = good_rows.repartition(partitions, *[tf.col(k) for k in tf.key_columns(source, entity)])
    checked = shared_cache.cache(key, _checked(ctx, good_rows, unique))
    counts = shared_cache.counted(key, "checked", lambda: _count_checked(ctx, checked, read))
    written = checked
    if ctx.per_date:
        written = tf.latest_good_date(checked, source, entity)
        if "sql" in conf.sinks:
            written = written.sortWithinPartitions(tf.ENTITY_ID)
        written = shared_cache.cache(key, written)
        latest = shared_cache.counted(key, "latest", written.count)
        counts = replace(counts, earlier_dates=counts.entities - latest, entities=latest)
    for_writers = _for_writers(conf, counts.entities, written)
    ds = None if ctx.per_date else ctx.date.isoformat()
    quarantine = tf.quarantine_rows(tagged, source, ds, "key").unionByName(
        tf.quarantine_rows(checked.drop(tf.ENTITY_ID), source, ds, "value")
    )
    return Prepared(
        snapshot=tf.snapshot_for_checks(checked, tagged, source, entity, ctx.per_date),
        good=for_writers(tf.encode_ready(written, source)),
        sql_good=for_writers(tf.sql_ready(written)) if "sql" in conf.sinks else None,
        quarantine=quarantine,
        cached=[tagged, checked, *([written] if ctx.per_date else [])],
        counts=counts,
        share_key=key,
    )


def _count_read(ctx: RunContext, tagged: DataFrame) -> dict:
    """Rows read and those with unusable keys, and how many of the rows to de-duplicate
    repeat a key (none: the de-duplication has nothing to do and is skipped); long layout:
    rows of undefined names, and the (entity, name) pairs the de-duplication keeps."""
    source = ctx.source
    bad = tf.is_bad(tagged)
    dated = [source.date_column] if ctx.per_date else []
    keys = [*tf.key_columns(source, ctx.entity), *dated]
    aggs = [F.count(F.lit(1)).alias("rows"), F.sum(bad.cast("long")).alias("bad")]
    if source.layout == "long":
        defined = tf.col(source.name_column).isin([f.source_column for f in source.features])
        aggs.append(F.sum((~bad & ~defined).cast("long")).alias("ignored"))
        aggs.append(F.count_distinct(F.when(~bad & defined, F.struct(*[tf.col(k) for k in [*keys, source.name_column]]))).alias("latest"))
    else:
        aggs.append(F.count_distinct(F.when(~bad, F.struct(*[tf.col(k) for k in keys]))).alias("latest"))
    read = {k: v or 0 for k, v in tagged.agg(*aggs).first().asDict().items()}
    read["duplicates"] = read["rows"] - read["bad"] - read.get("ignored", 0) - read["latest"]
    return read


def _checked(ctx: RunContext, good_rows: DataFrame, unique: bool) -> DataFrame:
    """One row per entity (per date in a range) with its features typed and its value problems tagged."""
    source, entity = ctx.source, ctx.entity
    if source.layout == "wide":
        features = tf.wide_features(good_rows, source, entity, ctx.per_date, unique)
    else:
        features = tf.long_features(good_rows, source, entity, ctx.per_date, unique)
    checked = tf.with_entity_id(tf.tag_value_problems(features, source), source, entity)
    if ctx.window is not None:  # each entity as of its row's event time
        checked = event_time.with_event_as_of(checked, source)
    if "sql" in ctx.conf.sinks:
        checked = tf.with_json_maps(checked, source, ctx.conf.sql.max_map_bytes)
        if not ctx.per_date:
            # The SQL writers send rows sorted by key. Sorted here, as the snapshot is cached,
            # the write streams at once instead of leaving the database idle during a sort.
            checked = checked.sortWithinPartitions(tf.ENTITY_ID)
    return checked


def _count_checked(ctx: RunContext, checked: DataFrame, read: dict) -> SnapshotCounts:
    found = checked.agg(
        F.count(F.lit(1)).alias("rows"),
        F.sum(tf.is_bad(checked).cast("long")).alias("bad"),
        F.sum((F.col(tf.CONFLICTS) > 0).cast("long")).alias("conflicts"),
    ).first()
    rows, value_bad = found["rows"], found["bad"] or 0
    tied = found["conflicts"] or 0
    keep_one = ctx.source.on_tie == "keep_one"  # ties are no conflict then: one row of each is written
    ignored = read.get("ignored", 0)
    kept = read["latest"] if ctx.source.layout == "long" else rows
    return SnapshotCounts(
        rows_read=read["rows"],
        bad_rows=read["bad"] + value_bad,
        ignored_rows=ignored,
        superseded_rows=read["rows"] - read["bad"] - ignored - kept,
        entities=rows - value_bad,
        snapshot_entities=rows + read["bad"],
        conflicting_keys=0 if keep_one else tied,
        tied_keys_kept=tied if keep_one else 0,
    )


def _for_writers(conf, entities: int, written: DataFrame):
    """Long sources and date ranges read many rows per entity: the writers get as many
    partitions as the entities need (each opens its own connections). Merging gives up
    the order, so the SQL write then sorts again."""
    writers = max(conf.spark.shuffle_partitions, math.ceil(entities / conf.spark.rows_per_partition))
    merge = writers < written.rdd.getNumPartitions()
    return (lambda df: df.coalesce(writers)) if merge else (lambda df: df)
