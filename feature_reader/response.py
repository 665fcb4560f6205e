"""A read's result, column-wise as Feast returns it, and Feast's JSON response body."""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

PRESENT, NULL_VALUE, NOT_FOUND, OUTSIDE_MAX_AGE = "PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"
INVALID = "INVALID"
"""Feast's name for a value that cannot be served: here, stored bytes that do not decode."""
STALE = "STALE"
"""Not one of Feast's: a value from an expired cache entry, served because its store failed (stale-if-error)."""

EPOCH = "1970-01-01T00:00:00Z"


@dataclass(slots=True)
class FeatureColumn:
    name: str
    values: list
    statuses: list[str]
    event_timestamps: list[int | None]
    """The source's as-of time per entity (UTC epoch seconds), None where NOT_FOUND."""


class OnlineFeatures:
    """The result: the request's join keys, then a column per requested feature. Columns are
    made from the rows read when first asked for (``to_dict()``, ``column()``...): a read
    answered from the cache costs no per-feature work until then; statuses are made only
    when asked for."""

    __slots__ = ("join_keys", "names", "_values", "_statuses", "_stamps", "_pending")

    def __init__(
        self, join_keys: dict[str, list], names: list[str], values: list, statuses: list, stamps: list, pending: list | None = None
    ):
        # statuses[i] None: every value PRESENT; stamps[i] may be shared by a source's columns
        # (copied when handed out); pending: (positions, value indexes or None for all in
        # order, row tuples, as-of times) of sources whose columns are the rows transposed
        self.join_keys, self.names = join_keys, names
        self._values, self._statuses, self._stamps = values, statuses, stamps
        self._pending = pending

    def _ready(self) -> None:
        if not self._pending:
            return
        for positions, indexes, tuples, as_of in self._pending:
            transposed = list(map(list, zip(*tuples)))
            if indexes is None:
                self._values[positions[0] : positions[-1] + 1] = transposed
                self._stamps[positions[0] : positions[-1] + 1] = [as_of] * len(positions)
            else:
                for at, i in zip(positions, indexes):
                    self._values[at], self._stamps[at] = transposed[i], as_of
        self._pending = None

    def _column(self, at: int) -> FeatureColumn:
        self._ready()
        statuses = self._statuses[at]
        values = self._values[at]
        return FeatureColumn(
            self.names[at], values, [PRESENT] * len(values) if statuses is None else list(statuses), list(self._stamps[at])
        )

    @property
    def columns(self) -> list[FeatureColumn]:
        return [self._column(at) for at in range(len(self.names))]

    def column(self, name: str) -> FeatureColumn:
        return self._column(self.names.index(name))

    def to_dict(self) -> dict[str, list]:
        """Entity columns and feature values by name (Feast's OnlineResponse.to_dict())."""
        self._ready()
        return {**self.join_keys, **dict(zip(self.names, self._values))}

    def to_feast(self) -> dict[str, Any]:
        """Feast's get-online-features response body: ``results`` (join keys first, each
        with values, statuses and event_timestamps) then ``metadata.feature_names``; the
        body of ``to_feast_json()`` as Python objects."""
        return orjson.loads(self.to_feast_json())

    def to_feast_json(self) -> bytes:
        """Feast's response body as compact UTF-8 JSON (the server's body, and `materialize get`'s output)."""
        self._ready()
        rows = len(next(iter(self.join_keys.values()), []))
        present, epochs = [PRESENT] * rows, [EPOCH] * rows
        results = [{"values": v, "statuses": present, "event_timestamps": epochs} for v in self.join_keys.values()]
        # a source's columns share one list of as-of times: each formatted once
        formatted: dict[int, list[str]] = {}
        results += [
            {"values": v, "statuses": present if st is None else st,
             "event_timestamps": formatted[k] if (k := id(ts)) in formatted else formatted.setdefault(k, [_timestamp(t) for t in ts])}
            for v, st, ts in zip(self._values, self._statuses, self._stamps)
        ]  # fmt: skip
        # embeddings are numpy arrays: orjson hands them to _native (its own numpy option
        # writes float32 in their shortest form, not widened to float64 as Feast writes them)
        return orjson.dumps({"results": results, "metadata": {"feature_names": [*self.join_keys, *self.names]}}, default=_native)


def _native(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not a JSON value: {type(value).__name__}")


@functools.lru_cache(maxsize=4096)  # a source's rows share a few as-of times
def _timestamp(epoch: int | None) -> str:
    if not epoch:
        return EPOCH
    try:
        return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):  # the stores refuse such as-of times (decode.MAX_AS_OF); a body is never lost to one
        return EPOCH
