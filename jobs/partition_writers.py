"""Functions that run inside Spark partitions (module-level: only their config is pickled).

Each takes the Arrow batches of one partition, encodes them column-wise and writes them
with a sink opened inside the partition, then yields one row of stats. No data goes
back to the driver; memory per task is bounded by the Arrow batch size.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from dataclasses import dataclass

import hiredis
import pyarrow as pa
import pyarrow.compute as pc
import redis

from serializers.batch import FeatureSpec, encode_batch
from sinks.errors import SinkError
from sinks.redis_cluster import RedisClusterSink
from sinks.redis_sink import CeilingReached, RedisSink, RedisSinkConfig
from sinks.sql_sink import SqlSink, SqlSinkConfig

STATS_SCHEMA = (
    "entities long, skipped_newer long, values_set long, values_deleted long, non_finite long, bytes_sent long, "
    "round_trips long, retries long, redirects long, peak_rss long, seconds double, stopped string, error string"
)


@dataclass(frozen=True)
class RedisWritePlan:
    sink: RedisSinkConfig
    features: tuple[FeatureSpec, ...]
    as_of_column: str | None = None
    """Range runs: the column holding each row's freshness value."""


def peak_rss() -> int:
    """Peak resident memory of this Python worker so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


_STATS_ARROW = pa.schema(
    [(name, pa.int64()) for name in ("entities", "skipped_newer", "values_set", "values_deleted", "non_finite", "bytes_sent", "round_trips", "retries", "redirects", "peak_rss")]
    + [("seconds", pa.float64()), ("stopped", pa.string()), ("error", pa.string())]
)


def _stats_batch(stats: dict) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([stats], schema=_STATS_ARROW)


def write_redis_partition(plan: RedisWritePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    start = time.perf_counter()
    stopped = error = None
    sink = RedisClusterSink(plan.sink) if plan.sink.cluster else RedisSink(plan.sink)
    try:
        sink.open()  # checks the hard ceiling (of every primary) before the first write
        for batch in batches:
            if batch.num_rows:
                as_of = batch.column(plan.as_of_column) if plan.as_of_column else None
                sink.write_batch(encode_batch(batch, list(plan.features)), as_of)
    except CeilingReached as exc:
        # Stop this writer and report; the driver sums every writer and fails the run.
        stopped = str(exc)
    except SinkError as exc:
        # Retries are exhausted or Redis refused a command: report it with what was written.
        error = f"{type(exc).__name__}: {exc}"
    except (redis.RedisError, hiredis.ProtocolError) as exc:
        # e.g. NOPERM for a command the ACL does not allow: no retry of the task can help
        error = f"TerminalSinkError: Redis: {type(exc).__name__}: {exc}"
    finally:
        sink.close()
    stats = {**sink.stats.as_dict(), "peak_rss": peak_rss(), "seconds": time.perf_counter() - start, "stopped": stopped, "error": error}
    yield _stats_batch(stats)


SQL_STATS_SCHEMA = (
    "rows_upserted long, rows_skipped_newer long, duplicates long, statements long, transactions long, retries long, reconnects long, "
    "bytes_sent long, non_finite long, peak_rss long, seconds double, error string"
)
_SQL_STATS_ARROW = pa.schema(
    [(name, pa.int64()) for name in ("rows_upserted", "rows_skipped_newer", "duplicates", "statements", "transactions", "retries", "reconnects", "bytes_sent", "non_finite", "peak_rss")]
    + [("seconds", pa.float64()), ("error", pa.string())]
)


@dataclass(frozen=True)
class SqlWritePlan:
    sink: SqlSinkConfig
    key_column: str = "_id"
    json_column: str = "_features_json"
    non_finite_column: str = "_non_finite"
    as_of_column: str | None = None


def write_sql_partition(plan: SqlWritePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Upsert one partition's rows (sorted by key) through one connection; yield its stats."""
    start = time.perf_counter()
    error = None
    non_finite = bytes_sent = 0
    sink = SqlSink(plan.sink)
    try:
        sink.open()
        for batch in batches:
            non_finite += pc.sum(batch.column(plan.non_finite_column)).as_py() or 0
            bytes_sent += pc.sum(pc.binary_length(batch.column(plan.json_column))).as_py() or 0
            keys, docs = batch.column(plan.key_column).to_pylist(), batch.column(plan.json_column).to_pylist()
            as_ofs = batch.column(plan.as_of_column).to_pylist() if plan.as_of_column else [None] * len(keys)
            for key, doc, as_of in zip(keys, docs, as_ofs):
                sink.add(key, doc, as_of)
        sink.flush()
    except SinkError as exc:
        # Retries are exhausted or the error is terminal: report it, the driver fails the run.
        error = str(exc)
    finally:
        sink.close()
    stats = {**sink.stats.as_dict(), "non_finite": non_finite, "bytes_sent": bytes_sent, "peak_rss": peak_rss(), "seconds": time.perf_counter() - start, "error": error}
    yield pa.RecordBatch.from_pylist([stats], schema=_SQL_STATS_ARROW)
