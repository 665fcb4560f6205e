"""Partition side: the write plan every Redis writer gets, and the writer it builds.

The writer takes the partition's Arrow batches as they come (entity id, one column per
feature, for range runs each row's as-of time), encodes them column-wise
(:mod:`serializers.batch`) and writes them to the server, or to the slot owners of a
Redis Cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import hiredis
import pyarrow as pa
import pyarrow.compute as pc
import redis

from serializers.batch import AS_OF_US, FeatureSpec, encode_batch
from sinks.base import RedisWriteStats
from sinks.redis.cluster import RedisClusterSink
from sinks.redis.config import RedisSinkConfig
from sinks.redis.node import CeilingReached, RedisSink
from stores.errors import MaterializerError


@dataclass(frozen=True)
class RedisWritePlan:
    """What the driver's preflight hands every writer (pickled): no data, no connection."""

    sink: RedisSinkConfig
    features: tuple[FeatureSpec, ...]
    as_of_column: str | None = None
    """Range runs: the column holding each row's freshness value."""

    stats_type: ClassVar[type] = RedisWriteStats
    store: ClassVar[str] = "Redis"

    def writer(self) -> RedisWriter:
        return RedisWriter(self)


class RedisWriter:
    stops = (CeilingReached,)
    errors = (MaterializerError, redis.RedisError, hiredis.ProtocolError)

    def __init__(self, plan: RedisWritePlan):
        self.plan = plan
        self.sink = RedisClusterSink(plan.sink) if plan.sink.cluster else RedisSink(plan.sink)

    @property
    def stats(self) -> RedisWriteStats:
        return self.sink.stats

    def open(self) -> None:
        self.sink.open()  # checks the hard ceiling (of every primary) before the first write

    def write_batch(self, batch: pa.RecordBatch) -> RedisWriteStats:
        as_of = batch.column(self.plan.as_of_column) if self.plan.as_of_column else None
        encoded = encode_batch(batch, list(self.plan.features))
        if as_of is not None and AS_OF_US in batch.schema.names:  # past the whole second: microseconds
            encoded = replace(encoded, subsecond=pc.subtract(batch.column(AS_OF_US), pc.multiply(as_of.cast(pa.int64()), 1_000_000)))
        self.sink.write_batch(encoded, as_of)
        return self.stats

    def flush(self) -> None:
        """Every chunk is acknowledged before write_batch returns: nothing is buffered. A
        cluster writer fails here when a down primary's entities were left unwritten."""
        if isinstance(self.sink, RedisClusterSink):
            self.sink.flush()

    def close(self) -> None:
        self.sink.close()
