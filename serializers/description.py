"""What a store holds, recorded in the store itself (format 1.3, FORMAT.md "The stores'
description"): per entity type, each stored name's encoding, the source that writes it,
and whether it is retired. Writers record it before the values it describes; readers
never decode a stored name under an encoding the store does not record for it.

Redis: one hash per entity type named as its key prefix without the separator
(``[<namespace>:]<prefix>``: entity keys always go on with ``:<id>``), field = the stored
name, value = ``<encoding> <source>`` or ``<encoding> <source> retired``.
SQL: one table, ``stored_names``, a row per (entity table, stored name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from serializers.keys import key_prefix

# (stored, defined) encodings whose stored bytes the defined one reads as the same values.
COMPATIBLE = frozenset({("int", "float"), ("float/float32", "float")})

SQL_TABLE = "stored_names"
RETIRED = "retired"


class Held(NamedTuple):
    """What a store records for one stored name."""

    encoding: str
    source: str
    retired: bool = False

    def text(self) -> str:
        return f"{self.encoding} {self.source}" + (f" {RETIRED}" if self.retired else "")


class DescriptionError(ValueError):
    """A description entry no writer of this format writes."""


Description = dict[str, Held]
"""Stored name -> what the store holds under it, for one entity type."""


def redis_key(prefix: str, namespace: str | None = None) -> bytes:
    """The hash describing entity type ``prefix``: its key prefix without the separator."""
    return key_prefix(prefix, namespace)[:-1].encode("utf-8")


def redis_key_of(key_prefix: str) -> bytes:
    """The same from a key prefix as the writers hold it (``c:``)."""
    return key_prefix[:-1].encode("utf-8")


def redis_value(held: Held) -> bytes:
    return held.text().encode("utf-8")


def parse_value(name: str, value: bytes | str) -> Held:
    """One entry of a description (a Redis hash value; SQL gives the parts as columns)."""
    text = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    parts = text.split(" ")
    if len(parts) not in (2, 3) or not all(parts) or (len(parts) == 3 and parts[2] != RETIRED):
        raise DescriptionError(f"stored name {name!r}: {text[:80]!r} is not '<encoding> <source> [retired]'")
    return Held(parts[0], parts[1], len(parts) == 3)


def parse_redis(fields: Mapping[bytes, bytes]) -> Description:
    """A description hash as HGETALL returns it."""
    return {k.decode("utf-8", "replace"): parse_value(k.decode("utf-8", "replace"), v) for k, v in fields.items()}


def conflict(held: Held | None, source: str, encoding: str) -> str | None:
    """Why values stored under a name as ``held`` must not be read (or written) as feature
    ``encoding`` of ``source``; None when they may. A name the store does not describe is
    no conflict: nothing was recorded for it (a new name, or values written before stores
    were described)."""
    if held is None:
        return None
    if held.retired:
        return f"retired in this store (last written as {held.encoding} by source {held.source!r})"
    if held.source != source:
        return f"holds values of source {held.source!r}"
    if held.encoding != encoding and (held.encoding, encoding) not in COMPATIBLE:
        return f"stored as {held.encoding}, defined as {encoding}"
    return None


def updated(held: Description, source: str, encodings: Mapping[str, str]) -> Description:
    """The entries a write of ``source`` (stored name -> encoding, every feature it writes)
    records: each of its names with its encoding, and the names it wrote before and no
    longer writes, retired. Call only when no name conflicts."""
    out = {name: Held(encoding, source) for name, encoding in encodings.items()}
    for name, h in held.items():
        if h.source == source and not h.retired and name not in encodings:
            out[name] = h._replace(retired=True)
    return {name: h for name, h in out.items() if held.get(name) != h}


def conflicts(held: Description, source: str, encodings: Mapping[str, str]) -> dict[str, str]:
    """Stored name -> why ``source`` may not write it as the encoding given."""
    return {name: why for name, enc in encodings.items() if (why := conflict(held.get(name), source, enc))}


# SQL: one table in the entity tables' schema; ``{}`` is its quoted name (CockroachDB spells TEXT as STRING).
CREATE_TABLE = {
    "postgres": "CREATE TABLE IF NOT EXISTS {} (entity_table TEXT NOT NULL, stored_name TEXT NOT NULL, encoding TEXT NOT NULL, "
    "source TEXT NOT NULL, retired BOOLEAN NOT NULL DEFAULT false, PRIMARY KEY (entity_table, stored_name))",
    "cockroach": "CREATE TABLE IF NOT EXISTS {} (entity_table STRING NOT NULL, stored_name STRING NOT NULL, encoding STRING NOT NULL, "
    "source STRING NOT NULL, retired BOOL NOT NULL DEFAULT false, PRIMARY KEY (entity_table, stored_name))",
}
UPSERT = (
    "INSERT INTO {} (entity_table, stored_name, encoding, source, retired) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (entity_table, stored_name) DO UPDATE SET encoding = excluded.encoding, source = excluded.source, "
    "retired = excluded.retired"
)
SELECT = "SELECT entity_table, stored_name, encoding, source, retired FROM {} WHERE entity_table = ANY(%s)"


def sql_rows(entity_table: str, entries: Description) -> list[tuple]:
    """The upsert's parameters, in stored-name order."""
    return [(entity_table, name, h.encoding, h.source, h.retired) for name, h in sorted(entries.items())]


def from_sql(rows) -> dict[str, Description]:
    """Entity table -> its description, from the SELECT's rows."""
    out: dict[str, Description] = {}
    for table, name, encoding, source, retired in rows:
        out.setdefault(table, {})[name] = Held(encoding, source, bool(retired))
    return out
