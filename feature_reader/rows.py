"""What a store read gives back per (source, entity): the source's as-of time (None: the
store holds nothing of the source for the entity) and the decoded values read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Unit(NamedTuple):
    """One source of one entity: what a store read, the cache and single-flight are keyed by."""

    source: str
    entity_id: str


@dataclass(frozen=True, slots=True)
class SourceRow:
    as_of: int | None
    """The source's freshness value (UTC epoch seconds); None: NOT_FOUND."""
    values: dict
    """Feature name -> value (None: not stored; decode.BAD: did not decode)."""
    size: int = 0
    """Approximate bytes, for the cache's bound."""
    stale: bool = False
    """Served from an expired cache entry because the store failed (stale-if-error)."""


NOT_FOUND_ROW = SourceRow(None, {}, 64)
