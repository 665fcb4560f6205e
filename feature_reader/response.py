"""A read's result, column-wise as Feast returns it, and Feast's JSON response body."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

PRESENT, NULL_VALUE, NOT_FOUND, OUTSIDE_MAX_AGE = "PRESENT", "NULL_VALUE", "NOT_FOUND", "OUTSIDE_MAX_AGE"
INVALID = "INVALID"
"""Feast's name for a value that cannot be served: here, stored bytes that do not decode."""
STALE = "STALE"
"""Not one of Feast's: a value from an expired cache entry, served because its store failed (stale-if-error)."""

EPOCH = "1970-01-01T00:00:00Z"


@dataclass
class FeatureColumn:
    name: str
    values: list
    statuses: list[str]
    event_timestamps: list[int | None]
    """The source's as-of time per entity (UTC epoch seconds), None where NOT_FOUND."""


@dataclass
class OnlineFeatures:
    join_keys: dict[str, list]
    columns: list[FeatureColumn]

    def to_dict(self) -> dict[str, list]:
        """Entity columns and feature values by name (Feast's OnlineResponse.to_dict())."""
        return {**self.join_keys, **{c.name: c.values for c in self.columns}}

    def column(self, name: str) -> FeatureColumn:
        return next(c for c in self.columns if c.name == name)

    def to_feast(self) -> dict[str, Any]:
        """Feast's get-online-features response body: ``results`` (join keys first, each
        with values, statuses and event_timestamps) then ``metadata.feature_names``."""
        rows = len(next(iter(self.join_keys.values()), []))
        results = [{"values": list(v), "statuses": [PRESENT] * rows, "event_timestamps": [EPOCH] * rows} for v in self.join_keys.values()]
        for c in self.columns:
            results.append({"values": [_native(v) for v in c.values], "statuses": c.statuses, "event_timestamps": [_timestamp(t) for t in c.event_timestamps]})
        return {"results": results, "metadata": {"feature_names": [*self.join_keys, *(c.name for c in self.columns)]}}

    def to_feast_json(self) -> bytes:
        return json.dumps(self.to_feast(), separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode("utf-8")


def _native(value: Any) -> Any:
    return value.tolist() if isinstance(value, np.ndarray) else value


def _timestamp(epoch: int | None) -> str:
    if not epoch:
        return EPOCH
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
