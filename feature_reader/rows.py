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
    """The source's freshness value (UTC epoch seconds); None: NOT_FOUND."""
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
    bad_as_of: bool = False
    """The source's freshness value is stored but unusable (no number, or past year 9999):
    every cell of the source is INVALID for this entity, counted in ``bad_freshness``."""

    def get(self, name: str) -> Any:
        at = self.names.get(name)
        return None if at is None else self.values[at]


NOT_FOUND_ROW = SourceRow(None, (), Layout([]), 64)
BAD_AS_OF_ROW = SourceRow(0, (), Layout([]), 64, bad_as_of=True)
"""A source whose freshness value is unusable: nothing of it is trusted, and it is not
NOT_FOUND either (the store holds something): not read again from the next store."""
