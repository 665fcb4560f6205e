"""What each store says it holds (serializers/description.py), and the features the reader
therefore never decodes from it.

A reader compares its definitions with each store's description: a feature whose stored
name the store holds as another encoding (one its bytes would be misread under), as
another source's values, or as retired, is refused in that store: its cells answer
INVALID (counted in ``refused_cells``), never a value decoded under the wrong type. The
description is read at the first read of each store and again every
``reader.description_refresh_seconds``; until a run has described an entity type the
store is undescribed for it and read as before (the health answer says so).

Each fetch uses a short-lived client of its own (a few keys or one query every half
minute): the reads' connections are tuned for the hot path and are left alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

import psycopg
import redis
from psycopg import sql

from feature_defs import Definitions
from feature_reader.errors import StoreError
from feature_reader.rows import SourceRow, Unit
from serializers.description import SELECT, SQL_TABLE, Description, DescriptionError, conflict, from_sql, parse_value, redis_key
from stores.redis import connect, connect_cluster
from stores.sql import connect as sql_connect
from stores.sql import table_identifier


class _Refused:
    """A cell of a feature the store does not hold as the definitions say: answered INVALID."""

    def __repr__(self) -> str:
        return "REFUSED"


REFUSED = _Refused()
STORE_NAMES = {"redis": "Redis", "sql": "SQL"}


def fetch_redis(
    defs: Definitions, rconf, namespace: str | None, cluster: bool, timeout: float, seeds: Sequence[tuple[str, int]] = ()
) -> dict[str, Description | None]:
    """Entity type -> the entries of its stored names (None: no entry for any: undescribed).
    HMGET of the reader's own names: the reader's ACL (conf/base/redis-acl.txt) grants it.
    ``seeds``: the cluster's nodes the reader knows, beside the URL's (which may be down)."""
    if cluster:
        client = connect_cluster(rconf, socket_timeout=timeout, connect_timeout=timeout, seeds=seeds)
    else:
        client = connect(rconf, socket_timeout=timeout, connect_timeout=timeout)
    try:
        out: dict[str, Description | None] = {}
        for entity, names in _names(defs).items():
            try:
                got = client.hmget(redis_key(defs.entities[entity].prefix, namespace), [n.encode("utf-8") for n in names])
            except redis.exceptions.NoPermissionError:  # an ACL from before descriptions (no ~<prefix>): read as before
                out[entity] = None
                continue
            out[entity] = _parsed(names, got)
        return out
    finally:
        client.close()


def fetch_sql(defs: Definitions, config) -> dict[str, Description | None]:
    """Entity type -> its description in the SQL store (None: undescribed: no table yet, or no row)."""
    tables = {defs.entities[e].sql_table: e for e in _names(defs)}
    # not a read's deadline (50 ms by default): a read now and then, off the hot path
    config = replace(config, statement_timeout_ms=max(config.statement_timeout_ms or 0, 2000))
    with sql_connect(config) as conn:
        try:
            rows = conn.execute(sql.SQL(SELECT).format(table_identifier(SQL_TABLE, config.schema)), (sorted(tables),)).fetchall()
        except (psycopg.errors.UndefinedTable, psycopg.errors.InsufficientPrivilege):
            rows = []  # no table yet, or a reader role granted before it (conf/base/sql-grants.sql): read as before
    found = from_sql(rows)
    return {entity: found.get(table) or None for table, entity in tables.items()}


def _names(defs: Definitions) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for source in defs.sources.values():
        out.setdefault(source.entity, []).extend(f.stored_name for f in source.features)
    return out


def _parsed(names: list[str], values: list) -> Description | None:
    out: Description = {}
    for name, value in zip(names, values):
        if value is not None:
            try:
                out[name] = parse_value(name, value)
            except DescriptionError:
                out[name] = None  # an entry no writer wrote: refuse the name (below)
    return out or None


class Verdicts:
    """Per store: the (source, feature) pairs refused, why, and what is undescribed."""

    def __init__(self, defs: Definitions):
        self.defs = defs
        self.refused: dict[str, dict[str, dict[str, str]]] = {}  # store -> source -> feature -> why
        self.undescribed: dict[str, list[str]] = {}  # store -> entity types
        self.read_at: dict[str, float] = {}  # store -> the last read of its description, or its last failure
        self.ok_at: dict[str, float] = {}  # store -> the last read that succeeded
        self.generation = 0  # changes whenever what is refused changes (rows masked before are not cached)
        self._lock = threading.Lock()

    def due(self, store: str, every: float, now: float) -> bool:
        return now - self.read_at.get(store, -1e18) >= every

    def stale(self, store: str, every: float, now: float) -> bool:
        """None read yet, or the last one that succeeded older than ``every``: not read by."""
        return now - self.ok_at.get(store, -1e18) >= every

    def known(self, store: str) -> bool:
        return store in self.ok_at

    def update(self, store: str, found: Mapping[str, Description | None], now: float) -> bool:
        """Take a store's description as fetched; whether what is refused there changed."""
        refused: dict[str, dict[str, str]] = {}
        for source in self.defs.sources.values():
            held = found.get(source.entity)
            if held is None:
                continue
            for f in source.features:
                if f.stored_name not in held:
                    continue
                entry = held[f.stored_name]
                why = "holds an entry no writer of this format writes" if entry is None else conflict(entry, source.name, f.encoding)
                if why:
                    refused.setdefault(source.name, {})[f.name] = (
                        f"{source.name}:{f.name}: {STORE_NAMES[store]} says its stored name {f.stored_name!r} is {why}"
                    )
        with self._lock:
            changed = refused != self.refused.get(store, {})
            self.refused[store] = refused
            self.undescribed[store] = sorted(e for e in _names(self.defs) if found.get(e) is None)
            self.read_at[store] = self.ok_at[store] = now
            if changed:
                self.generation += 1
        return changed

    def mask(self, store: str, rows: dict[Unit, SourceRow]) -> dict[Unit, SourceRow]:
        """The refused features' cells of a store's rows made REFUSED (the rows of other sources untouched)."""
        refused = self.refused.get(store)
        if not refused:
            return rows
        for unit, row in rows.items():
            names = refused.get(unit.source)
            if not names or not row.values:
                continue
            values = list(row.values)
            hit = False
            for name in names:
                at = row.names.get(name)
                if at is not None:
                    values[at], hit = REFUSED, True
            if hit:
                rows[unit] = row._replace(values=tuple(values), complete=False)
        return rows

    def report(self) -> dict:
        """For the health answer: per store with anything to say, the refused features (why)
        and the undescribed entity types (nothing when every store agrees with the definitions)."""
        out = {}
        with self._lock:
            for store in sorted(self.ok_at):
                refused = sorted(w for by_feature in self.refused.get(store, {}).values() for w in by_feature.values())
                undescribed = list(self.undescribed.get(store, []))
                if refused or undescribed:
                    out[store] = {"refused": refused, "undescribed": undescribed}
        return out

    def refused_features(self) -> int:
        with self._lock:
            return sum(len(v) for by_source in self.refused.values() for v in by_source.values())


def fetch_error(where: str, exc: BaseException) -> StoreError:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return StoreError(f"{where}: could not read what it holds (its description): {type(exc).__name__}: {text}")


def now() -> float:
    return time.monotonic()
