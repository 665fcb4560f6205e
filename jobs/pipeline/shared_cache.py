"""Prepared snapshots shared by the sources of a run that read the same rows alike.

Spark keeps one cache entry for equal plans. Two sources over the same table with the same
keys, columns, types and window (Feast's batch view and its push view, which the import puts
side by side) prepare equal plans, so when they run at once (``parallel_sources``) the second
reads the rows the first cached instead of reading and preparing them again. Each source's
plan carries its share key (a filter that is always true), so only sources with the same key
can share an entry, and a key's cached frames are unpersisted when the last source holding
it ends: one source's unpersist never drops an entry another still reads (before this, each
plan carried its source's name, and nothing was shared). What prepare counts of those frames
is shared the same way (:func:`counted`): the second source waits for the first's count.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from typing import TypeVar

from pyspark import StorageLevel
from pyspark.sql import DataFrame

T = TypeVar("T")
_lock = threading.Lock()
_holders: dict[str, int] = {}
_frames: dict[str, list[DataFrame]] = {}
_counts: dict[tuple[str, str], object] = {}
_counting: dict[tuple[str, str], threading.Lock] = {}


def share_key(source, entity, date, end, window, *, stored_names: bool) -> str:
    """What the prepared rows depend on, as a short digest: the source's definition without its
    name, descriptions and read settings (max age, Feast's ttl), its entity type's keys, the dates and the event-time window; and its
    stored names only when they are in the rows (``stored_names``: the SQL store's JSON objects
    are keyed by them)."""
    spec = source.model_dump(mode="json", exclude={"name", "description", "max_age_seconds", "feast_ttl_seconds"})
    for feature in spec.get("features", []):
        feature.pop("description", None)
        if not stored_names:
            feature.pop("stored_as", None)
    what = {
        "source": spec,
        "keys": [key.model_dump(mode="json") for key in entity.keys],
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
    with _lock:  # not while the last holder of the key unpersists it (release)
        if df.storageLevel == StorageLevel.NONE:  # looked up by plan, as Spark shares the entry
            df = df.persist()
        _frames.setdefault(key, []).append(df)
    return df


def counted(key: str, what: str, count: Callable[[], T]) -> T:
    """``count()`` once for the sources holding ``key`` (a Spark job over the shared frames): a
    source that asks while another counts waits for its result instead of running the job again.
    A count that fails is not kept: the next source counts again."""
    with _lock:
        if (key, what) in _counts:
            return _counts[key, what]
        counting = _counting.setdefault((key, what), threading.Lock())
    with counting:
        with _lock:
            if (key, what) in _counts:
                return _counts[key, what]
        found = count()
        with _lock:
            if key in _holders:  # not after the last holder released the key
                _counts[key, what] = found
        return found


def release(key: str) -> None:
    """A source holding ``key`` is done with its cached frames: the last one unpersists them all."""
    with _lock:
        _holders[key] -= 1
        if _holders[key]:
            return
        del _holders[key]
        for shared in [k for k in (*_counts, *_counting) if k[0] == key]:
            _counts.pop(shared, None)
            _counting.pop(shared, None)
        for df in _frames.pop(key, []):
            df.unpersist()  # not blocking: the entry is gone before another source can look it up


def holders(key: str) -> int:
    """Sources holding ``key`` now (for tests)."""
    with _lock:
        return _holders.get(key, 0)
