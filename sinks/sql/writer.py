"""Partition side: the write plan every SQL writer gets, and the writer it builds.

The writer takes the partition's Arrow batches sorted by entity id, each row holding the
entity's features as one JSON object built in Spark (:mod:`serializers.json_map`, so an
oversized object is quarantined before any write), and upserts them column-wise
(:class:`~sinks.sql.upserts.SqlSink`): no per-row Python loop feeds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pyarrow as pa
import pyarrow.compute as pc

from serializers.batch import AS_OF_US
from sinks.base import SqlWriteStats
from sinks.sql.config import SqlSinkConfig
from sinks.sql.upserts import SqlSink
from stores.errors import MaterializerError


@dataclass(frozen=True)
class SqlWritePlan:
    """What the driver's preflight hands every writer (pickled): no data, no connection."""

    sink: SqlSinkConfig
    key_column: str = "_id"
    json_column: str = "_features_json"
    non_finite_column: str = "_non_finite"
    as_of_column: str | None = None
    """Range runs: the column holding each row's as-of epoch."""

    stats_type: ClassVar[type] = SqlWriteStats
    store: ClassVar[str] = "SQL"

    def writer(self) -> SqlWriter:
        return SqlWriter(self)


class SqlWriter:
    stops = ()
    errors = (MaterializerError,)

    def __init__(self, plan: SqlWritePlan):
        self.plan = plan
        self.sink = SqlSink(plan.sink)

    @property
    def stats(self) -> SqlWriteStats:
        return self.sink.stats

    def open(self) -> None:
        self.sink.open()

    def write_batch(self, batch: pa.RecordBatch) -> SqlWriteStats:
        p, stats = self.plan, self.sink.stats
        stats.non_finite += pc.sum(batch.column(p.non_finite_column)).as_py() or 0
        stats.bytes_sent += pc.sum(pc.binary_length(batch.column(p.json_column))).as_py() or 0
        as_ofs = batch.column(p.as_of_column) if p.as_of_column else None
        if as_ofs is not None and AS_OF_US in batch.schema.names:  # to the microsecond: the order of writes
            as_ofs = batch.column(AS_OF_US).cast(pa.timestamp("us", tz="UTC"))
        self.sink.write_batch(batch.column(p.key_column), batch.column(p.json_column), as_ofs)
        return stats

    def flush(self) -> None:
        self.sink.flush()

    def close(self) -> None:
        self.sink.close()
