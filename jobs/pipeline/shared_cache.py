"""Prepared snapshots shared by the sources of a run that read the same rows alike.

Spark keeps one cache entry for equal plans. Two sources over the same table with the same
keys, columns, types and window (Feast's batch view and its push view, which the import puts
side by side) prepare equal plans, so the second reads the rows the first cached instead of
reading and preparing them again. Each source's plan carries its share key (a filter that is
always true): sources whose definitions differ but for names, descriptions and stored names
never share an entry, and a source's cached frames are unpersisted when the last source
holding its key ends (before this, one source's unpersist dropped the entry under another
still reading it: each plan then carried its source's name and shared nothing).
"""

from __future__ import annotations

import hashlib
import json
import threading

from pyspark import StorageLevel
from pyspark.sql import DataFrame

_lock = threading.Lock()
_holders: dict[str, int] = {}
_frames: dict[str, list[DataFrame]] = {}


def share_key(source, entity, date, end, window) -> str:
    """What the prepared rows depend on, as a short digest: the source's definition without its
    name, descriptions and stored names (they change no prepared row), its entity type, the
    dates and the event-time window."""
    spec = source.model_dump(mode="json", exclude={"name", "description"})
    for feature in spec.get("features", []):
        feature.pop("stored_as", None)
        feature.pop("description", None)
    what = {
        "source": spec,
        "entity": entity.model_dump(mode="json", exclude={"description"}),
        "dates": [str(date), str(end)],
        "window": None if window is None else [str(window.start), str(window.end)],
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:16]


def hold(key: str) -> None:
    """A source starts preparing with ``key``."""
    with _lock:
        _holders[key] = _holders.get(key, 0) + 1


def cache(key: str, df: DataFrame) -> DataFrame:
    """``df`` cached for the sources holding ``key`` (unpersisted with the last of them); a plan
    another source cached already is used as it is (Spark would warn that it is cached)."""
    if df.storageLevel == StorageLevel.NONE:  # looked up by plan, as Spark shares the entry
        df = df.persist()
    with _lock:
        _frames.setdefault(key, []).append(df)
    return df


def release(key: str) -> None:
    """A source holding ``key`` is done with its cached frames: the last one unpersists them all."""
    with _lock:
        _holders[key] -= 1
        if _holders[key]:
            return
        del _holders[key]
        frames = _frames.pop(key, [])
    for df in frames:
        df.unpersist()


def holders(key: str) -> int:
    """Sources holding ``key`` now (for tests)."""
    with _lock:
        return _holders.get(key, 0)
