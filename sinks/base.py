"""The shape every store has: what its writers report, and the contract they keep.

A store is a folder (``sinks/redis``, ``sinks/sql``) with the same files:

- ``settings.py``: its section of the run configuration;
- ``config.py``: the frozen, picklable config its connections and writers are built from;
- ``client.py``: its connection builder (TLS, credentials, timeouts, what is transient);
- ``preflight.py``: the driver-side step before any write (schema, mode, capacity,
  baselines) that returns a small picklable :class:`WritePlan`;
- ``writer.py``: the plan and its partition-side :class:`StoreWriter`, which takes Arrow
  batches: ``write_batch(batch) -> WriteStats``.

:func:`sinks.partition.write_partition` runs any store's writer inside a Spark partition.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Protocol

import pyarrow as pa


@dataclass
class WriteStats:
    """What a writer wrote; summed over batches and partitions (each store adds its counters)."""

    def add(self, other: WriteStats) -> WriteStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RedisWriteStats(WriteStats):
    entities: int = 0
    values_set: int = 0
    values_deleted: int = 0
    non_finite: int = 0
    bytes_sent: int = 0
    round_trips: int = 0
    retries: int = 0
    redirects: int = 0
    """Redis Cluster: entities sent again to another node after MOVED/ASK."""
    skipped_newer: int = 0
    """Entities left as they were: the store holds a newer snapshot of the source."""
    replaced_future: int = 0
    """Entities written over an as-of time beyond the horizon (later than any date a run
    accepts: corrupt); counted in ``entities`` too."""
    unreachable: int = 0
    """Redis Cluster: entities not written because their slots' primary was down and no
    replica took over within redis.failover_timeout (the writer then ends with an error)."""


@dataclass
class SqlWriteStats(WriteStats):
    rows_upserted: int = 0
    """Rows written (inserted, or replacing an older or equal snapshot)."""
    rows_skipped_newer: int = 0
    """Rows left as they were: the table holds a newer snapshot of the entity and source."""
    rows_replaced_future: int = 0
    """Rows written over an as_of beyond the horizon (later than any date a run accepts:
    corrupt); counted in ``rows_upserted`` too."""
    expiry_followed: int = 0
    """Rows of other sources of the entities written whose expiry moved to the write's (the entity's TTL)."""
    duplicates: int = 0
    """Repeated keys in the input; the last row of a key wins."""
    statements: int = 0
    transactions: int = 0
    retries: int = 0
    reconnects: int = 0
    non_finite: int = 0
    """Non-finite values left out of the JSON objects (written as absent)."""
    bytes_sent: int = 0
    """Bytes of the JSON objects sent."""


@dataclass
class Outcome:
    """What every writer reports besides its store's stats: one format for both stores."""

    peak_rss: int = 0
    seconds: float = 0.0
    stopped: str | None = None
    """Why this writer stopped early without an error of its own (Redis: the memory ceiling)."""
    error_kind: str | None = None
    error: str | None = None
    """The error that ended this writer (sinks.errors.to_wire), rebuilt as its class on the driver."""


class StoreWriter(Protocol):
    """Partition side: opened inside the partition, fed Arrow batches, closed whatever happens."""

    stats: WriteStats
    stops: ClassVar[tuple[type[BaseException], ...]]
    """Errors that stop the writer early and are reported as ``stopped`` (not as its error)."""
    errors: ClassVar[tuple[type[BaseException], ...]]
    """Errors reported as the writer's error (kind, message); any other fails the Spark task."""

    def open(self) -> None: ...

    def write_batch(self, batch: pa.RecordBatch) -> WriteStats:
        """Write (or buffer) one batch; returns the writer's stats so far."""

    def flush(self) -> None:
        """Write what is buffered (after the last batch)."""

    def close(self) -> None: ...


class WritePlan(Protocol):
    """Driver side's result, pickled to every partition: all a writer needs, nothing more."""

    stats_type: ClassVar[type[WriteStats]]
    store: ClassVar[str]

    def writer(self) -> StoreWriter: ...


_ARROW_TYPES = {"int": pa.int64(), "float": pa.float64(), "str | None": pa.string()}
_SPARK_TYPES = {pa.int64(): "long", pa.float64(): "double", pa.string(): "string"}


def stats_schema(stats_type: type[WriteStats]) -> tuple[pa.Schema, str]:
    """The Arrow schema and Spark DDL of a writer's stats row: its store's stats, then the
    outcome, derived from the dataclasses (annotations are strings: ``from __future__``)."""
    columns = [f for t in (stats_type, Outcome) for f in fields(t)]
    schema = pa.schema([(f.name, _ARROW_TYPES[f.type if isinstance(f.type, str) else f.type.__name__]) for f in columns])
    return schema, ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)
