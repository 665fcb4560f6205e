"""What a store read gives back per (source, entity): the source's as-of time (None: the
store holds nothing of the source for the entity) and the decoded values read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple


class Unit(NamedTuple):
    """One source of one entity: what a store read, the cache and single-flight are keyed by."""

    source: str
    entity_id: str


class Layout(dict):
    """Feature name -> position in a row's values, shared by the rows of one read; ``order``
    lists the names by position."""

    __slots__ = ("order",)

    def __init__(self, names: list[str]):
        super().__init__((n, j) for j, n in enumerate(names))
        self.order = list(names)


class SourceRow(NamedTuple):
    """A tuple, not a dataclass: a batch makes one per entity, and tuples are cheap to make."""

    as_of: int | None
    """The source's freshness value (UTC epoch seconds); None: NOT_FOUND; UNUSABLE_AS_OF: stored but unusable."""
    values: tuple
    """The values read, in the order of ``names`` (None: not stored; decode.BAD: did not decode)."""
    names: Mapping[str, int]
    """Feature name -> position in ``values``; shared by every row of one read."""
    size: int = 0
    """Approximate bytes, for the cache's bound."""
    complete: bool = False
    """Every value read is a value (no None, no BAD): the result takes its columns at once."""
    stale: bool = False
    """Served from an expired cache entry because its store failed (stale-if-error)."""

    def get(self, name: str) -> Any:
        at = self.names.get(name)
        return None if at is None else self.values[at]


NOT_FOUND_ROW = SourceRow(None, (), Layout([]), 64)
UNUSABLE_AS_OF = -62135596801
"""The as-of time of a source whose freshness value is stored but unusable (no number, or
outside years 1..9999): one second before any as-of time a store may hold, an int like
the others, so the usual rows pay nothing to tell it apart."""
BAD_AS_OF_ROW = SourceRow(UNUSABLE_AS_OF, (), Layout([]), 64)
"""A source whose freshness value is unusable: every cell of it INVALID for the entity,
counted in ``bad_freshness``; not NOT_FOUND either (the store holds something), so not
read again from the next store."""
