"""The shape every sink has: built from a frozen config, opened inside a partition."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol


@dataclass
class WriteStats:
    """What one sink wrote; summed over batches and partitions."""

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

    def add(self, other: WriteStats) -> WriteStats:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Sink(Protocol):
    def open(self) -> None: ...

    def write_batch(self, batch: Any) -> WriteStats: ...

    def close(self) -> None: ...

    def __enter__(self) -> Sink: ...

    def __exit__(self, *exc: object) -> None: ...
