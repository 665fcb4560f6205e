"""Functions that run inside Spark partitions (module-level: only their config is pickled).

Each takes the Arrow batches of one partition, encodes them column-wise and writes them
with a sink opened inside the partition, then yields one row of stats. No data goes
back to the driver; memory per task is bounded by the Arrow batch size.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields

import hiredis
import pyarrow as pa
import pyarrow.compute as pc
import redis

from serializers.batch import FeatureSpec, encode_batch
from sinks.base import WriteStats
from sinks.errors import SinkError, to_wire
from sinks.redis_cluster import RedisClusterSink
from sinks.redis_sink import CeilingReached, RedisSink, RedisSinkConfig
from sinks.sql_sink import SqlSink, SqlSinkConfig, SqlWriteStats


@dataclass
class Outcome:
    """What every writer reports besides its store's stats: one format for both stores."""

    peak_rss: int = 0
    seconds: float = 0.0
    stopped: str | None = None
    """Redis: why this writer stopped at the memory ceiling (not an error of the writer)."""
    error_kind: str | None = None
    error: str | None = None
    """The error that ended this writer (sinks.errors.to_wire), rebuilt as its class on the driver."""


_ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "str | None": pa.string()}
_SPARK_TYPES = {pa.int64(): "long", pa.float64(): "double", pa.string(): "string"}


def stats_schema(*types: type) -> tuple[pa.Schema, str]:
    """The Arrow schema and Spark DDL of a writer's stats row, from the stats dataclasses
    themselves (annotations are strings here: ``from __future__ import annotations``)."""
    schema = pa.schema([(f.name, _ARROW_TYPES[f.type if isinstance(f.type, str) else f.type.__name__]) for t in types for f in fields(t)])
    return schema, ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


@dataclass
class SqlCounts:
    """What the SQL writer counts of its input, besides the sink's stats."""

    non_finite: int = 0
    bytes_sent: int = 0


_STATS_ARROW, STATS_SCHEMA = stats_schema(WriteStats, Outcome)
_SQL_STATS_ARROW, SQL_STATS_SCHEMA = stats_schema(SqlWriteStats, SqlCounts, Outcome)


@dataclass(frozen=True)
class RedisWritePlan:
    sink: RedisSinkConfig
    features: tuple[FeatureSpec, ...]
    as_of_column: str | None = None
    """Range runs: the column holding each row's freshness value."""


def peak_rss() -> int:
    """Peak resident memory of this Python worker so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _stats_batch(schema: pa.Schema, *parts: dict) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{k: v for part in parts for k, v in part.items()}], schema=schema)


def write_redis_partition(plan: RedisWritePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    outcome, start = Outcome(), time.perf_counter()
    sink = RedisClusterSink(plan.sink) if plan.sink.cluster else RedisSink(plan.sink)
    try:
        sink.open()  # checks the hard ceiling (of every primary) before the first write
        for batch in batches:
            if batch.num_rows:
                as_of = batch.column(plan.as_of_column) if plan.as_of_column else None
                sink.write_batch(encode_batch(batch, list(plan.features)), as_of)
    except CeilingReached as exc:
        # Stop this writer and report; the driver sums every writer and fails the run.
        outcome.stopped = str(exc)
    except (SinkError, redis.RedisError, hiredis.ProtocolError) as exc:
        # Retries are exhausted, or Redis refused a command (e.g. NOPERM: terminal). Anything
        # else is a bug: it fails the task, with its traceback, as Spark reports it.
        outcome.error_kind, outcome.error = to_wire(exc, "Redis")
    finally:
        sink.close()
    outcome.peak_rss, outcome.seconds = peak_rss(), time.perf_counter() - start
    yield _stats_batch(_STATS_ARROW, sink.stats.as_dict(), asdict(outcome))


@dataclass(frozen=True)
class SqlWritePlan:
    sink: SqlSinkConfig
    key_column: str = "_id"
    json_column: str = "_features_json"
    non_finite_column: str = "_non_finite"
    as_of_column: str | None = None


def write_sql_partition(plan: SqlWritePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Upsert one partition's rows (sorted by key) through one connection; yield its stats."""
    outcome, counts, start = Outcome(), SqlCounts(), time.perf_counter()
    sink = SqlSink(plan.sink)
    try:
        sink.open()
        for batch in batches:
            counts.non_finite += pc.sum(batch.column(plan.non_finite_column)).as_py() or 0
            counts.bytes_sent += pc.sum(pc.binary_length(batch.column(plan.json_column))).as_py() or 0
            as_ofs = batch.column(plan.as_of_column) if plan.as_of_column else None
            sink.write_batch(batch.column(plan.key_column), batch.column(plan.json_column), as_ofs)
        sink.flush()
    except SinkError as exc:
        # Retries are exhausted or the error is terminal: report it, the driver fails the run.
        outcome.error_kind, outcome.error = to_wire(exc)
    finally:
        sink.close()
    outcome.peak_rss, outcome.seconds = peak_rss(), time.perf_counter() - start
    yield _stats_batch(_SQL_STATS_ARROW, sink.stats.as_dict(), asdict(counts), asdict(outcome))


def sum_partition_stats(stats: dict, parts: list, keys: tuple[str, ...], seconds: float, rate: tuple[str, str]) -> None:
    """Add up the writers' stats rows; ``rate`` is (name, counted key) of the per-second figure."""
    for key in keys:
        stats[key] = sum(p[key] for p in parts)
    # memory per Python worker, the figure that must stay flat as the data grows
    stats["worker_peak_rss"] = max((p["peak_rss"] for p in parts), default=0)
    # the rest of write_seconds is Spark's: scheduling, starting workers, the rows' first batch
    stats["slowest_writer_seconds"] = max((p["seconds"] for p in parts), default=0.0)
    stats["write_seconds"] = seconds
    stats[rate[0]] = stats[rate[1]] / seconds if seconds else 0.0
