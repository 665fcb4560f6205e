"""Functions that run inside Spark partitions (module-level: only their config is pickled).

Each takes the Arrow batches of one partition, encodes them column-wise and writes them
with a sink opened inside the partition, then yields one row of stats. No data goes
back to the driver; memory per task is bounded by the Arrow batch size.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from serializers.batch import FeatureSpec, encode_batch
from sinks.redis_sink import CeilingReached, RedisSink, RedisSinkConfig

STATS_SCHEMA = (
    "entities long, values_set long, values_deleted long, non_finite long, bytes_sent long, "
    "round_trips long, retries long, seconds double, stopped string"
)


@dataclass(frozen=True)
class RedisWritePlan:
    sink: RedisSinkConfig
    features: tuple[FeatureSpec, ...]


_STATS_ARROW = pa.schema(
    [(name, pa.int64()) for name in ("entities", "values_set", "values_deleted", "non_finite", "bytes_sent", "round_trips", "retries")]
    + [("seconds", pa.float64()), ("stopped", pa.string())]
)


def _stats_batch(stats: dict) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([stats], schema=_STATS_ARROW)


def write_redis_partition(plan: RedisWritePlan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    start = time.perf_counter()
    stopped = None
    sink = RedisSink(plan.sink)
    try:
        sink.open()  # checks the hard ceiling before the first write
        for batch in batches:
            if batch.num_rows:
                sink.write_batch(encode_batch(batch, list(plan.features)))
    except CeilingReached as exc:
        # Stop this writer and report; the driver sums every writer and fails the run.
        stopped = str(exc)
    finally:
        sink.close()
    yield _stats_batch({**sink.stats.as_dict(), "seconds": time.perf_counter() - start, "stopped": stopped})
