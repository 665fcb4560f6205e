"""Where an entity's features live: the key and field rules every writer and reader shares.

Redis: one hash per entity at ``[<namespace>:]<entity prefix>:<entity id>``; the entity id
is the key parts joined by ``:`` (ints in decimal). SQL: one row per (entity id, source).
Each source writes its freshness field ``_ts:<source>`` (field id as for a feature) holding
the snapshot's as-of time: the end of its date, UTC, in epoch seconds (decimal text). A
source selected by event time also writes ``_us:<source>``, the microseconds past that
second when there are any, so writes are ordered to the microsecond (FORMAT.md 1.4).
An entity type's TTL counts from each write, plus a share of jitter fixed per Redis key; the
SQL rows of that entity get the same seconds (``ttl_with_jitter``), so both stores retire it
together.
"""

from __future__ import annotations

import datetime as dt

import xxhash

from serializers.scalar import field_id

KEY_SEPARATOR = ":"
FRESHNESS_PREFIX = "_ts:"
SUBSECOND_PREFIX = "_us:"


def key_prefix(entity_prefix: str, namespace: str | None = None) -> str:
    """The part of every Redis key of an entity type before its entity id."""
    return f"{namespace}:{entity_prefix}:" if namespace else f"{entity_prefix}:"


def entity_id(*parts: object) -> str:
    """An entity's id from its key parts, in the entity's key order (ints in decimal)."""
    return KEY_SEPARATOR.join(str(p) for p in parts)


def redis_key(prefix: str, entity_id: str) -> bytes:
    return (prefix + entity_id).encode("utf-8")


def freshness_field_name(source: str) -> str:
    """The name of a source's freshness field (its field id is ``field_id`` of this name)."""
    return FRESHNESS_PREFIX + source


def freshness_field(source: str) -> bytes:
    """The Redis hash field holding a source's as-of time."""
    return field_id(freshness_field_name(source))


def subsecond_field_name(source: str) -> str:
    """The name of a source's sub-second field (version 1.4; sources selected by event time):
    the microseconds of the stored event time past its whole second, absent when none."""
    return SUBSECOND_PREFIX + source


def subsecond_field(source: str) -> bytes:
    return field_id(subsecond_field_name(source))


def as_of_epoch(date: dt.date) -> int:
    """A date's snapshot is as of the end of that day, UTC (the next midnight)."""
    return int(dt.datetime.combine(date + dt.timedelta(days=1), dt.time(), tzinfo=dt.UTC).timestamp())


def ttl_with_jitter(key: bytes, ttl: int, jitter: float) -> int:
    """An entity's TTL in seconds from a write: ``ttl`` plus a share of up to ``jitter``*ttl
    fixed by its Redis key (xxh32), so expiries spread out yet a rerun sets the same."""
    span = int(ttl * jitter)
    return ttl + (xxhash.xxh32_intdigest(key) % (span + 1) if span else 0)
