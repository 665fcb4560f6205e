"""Reads from the SQL store (CockroachDB; PostgreSQL on the same wire): one query per
entity table per batch, ``entity_key = ANY(...)`` for the sources involved, the JSON maps
parsed with exact ints and turned back into the declared types. Connections come from
psycopg_pool's pools (stores/sql.py), made on demand and kept for the next read."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

import psycopg
from psycopg import sql
from psycopg_pool import PoolTimeout

from feature_defs import Definitions, FeatureDef
from feature_reader.decode import BAD, from_json
from feature_reader.errors import ReadTimeout, StoreError
from feature_reader.rows import NOT_FOUND_ROW, Layout, SourceRow, Unit
from fm_config.sql import SqlConnection
from stores.sql import async_pool, is_transient, pool, server_address, table_identifier

QUERY = (
    "SELECT entity_key, source, features::text, extract(epoch FROM as_of)::bigint FROM {} WHERE entity_key = ANY(%s) AND source = ANY(%s)"
)


def _statements(defs: Definitions, schema: str | None, units: Sequence[Unit]) -> list[tuple[sql.Composed, list[str], list[str]]]:
    by_table: dict[str, tuple[set, set]] = defaultdict(lambda: (set(), set()))
    for unit in units:
        table = defs.entities[defs.sources[unit.source].entity].sql_table
        keys, sources = by_table[table]
        keys.add(unit.entity_id)
        sources.add(unit.source)
    return [(sql.SQL(QUERY).format(table_identifier(t, schema)), sorted(k), sorted(s)) for t, (k, s) in by_table.items()]


def _rows(units: Sequence[Unit], found: dict, features: dict[str, list[FeatureDef]], as_list: bool) -> dict[Unit, SourceRow]:
    names = {source: Layout([f.name for f in feats]) for source, feats in features.items()}
    out = {}
    for unit in units:
        hit = found.get(unit)
        if hit is None:
            out[unit] = NOT_FOUND_ROW
            continue
        text, as_of = hit
        try:
            doc = json.loads(text)  # exact ints, beyond 2^53 too
        except ValueError:
            doc = None
        feats = features[unit.source]
        if not isinstance(doc, dict):
            values = tuple(from_json(f, object()) for f in feats)  # every value BAD
        else:
            values = tuple(None if doc.get(f.name) is None else from_json(f, doc[f.name], as_list=as_list) for f in feats)
        complete = all(v is not None and v is not BAD for v in values)
        out[unit] = SourceRow(int(as_of), values, names[unit.source], len(text) + 48 * len(feats), complete)
    return out


def _store_error(where: str, timeout_ms: int, exc: psycopg.Error) -> StoreError:
    if getattr(exc, "sqlstate", None) == "57014":
        return ReadTimeout(f"SQL store at {where} did not answer in {timeout_ms} ms")
    kind = "transient" if is_transient(exc) else "refused"
    return StoreError(f"SQL store at {where} ({kind}): {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")


def _no_connection(where: str, exc: PoolTimeout) -> StoreError:
    # the pool goes on trying in the background (and logs why, logger psycopg.pool)
    return StoreError(f"SQL store at {where}: no connection ({str(exc).strip().splitlines()[0]})")


def _reader_connection(config: SqlConnection, timeout: float) -> SqlConnection:
    # the server's statement timeout is a read's deadline; a connect gets a little more
    return replace(
        config,
        statement_timeout_ms=max(1, int(timeout * 1000)),
        connect_timeout=max(2, int(timeout) + 1),
        application_name=config.application_name + "-reader",
    )


def _found(rows, found: dict) -> None:
    for key, source, text, as_of in rows:
        found[Unit(source, key)] = (text, as_of)


class SqlReads:
    """Synchronous reads over a pool of up to ``connections`` connections (thread-safe)."""

    def __init__(self, config: SqlConnection, defs: Definitions, *, timeout: float, connections: int):
        self.config = _reader_connection(config, timeout)
        self.defs, self.where = defs, server_address(config)
        self._pool = pool(self.config, max_size=connections, name="feature-reader")

    def read(self, units: Sequence[Unit], features: dict[str, list[FeatureDef]], as_list: bool = False) -> dict[Unit, SourceRow]:
        found: dict[Unit, tuple[str, int]] = {}
        try:
            with self._pool.connection() as conn:  # a connection that failed is not put back
                for query, keys, sources in _statements(self.defs, self.config.schema, units):
                    try:
                        rows = conn.execute(query, (keys, sources)).fetchall()
                    except psycopg.errors.UndefinedTable:
                        rows = []  # nothing written to this table yet: every entity NOT_FOUND
                    _found(rows, found)
        except PoolTimeout as exc:
            raise _no_connection(self.where, exc) from exc
        except psycopg.Error as exc:
            raise _store_error(self.where, self.config.statement_timeout_ms, exc) from exc
        return _rows(units, found, features, as_list)

    def ping(self) -> None:
        with self._pool.connection() as conn:
            conn.execute("SELECT 1")

    def close(self) -> None:
        self._pool.close()


class AsyncSqlReads:
    """asyncio reads over a pool of up to ``connections`` async connections (opened in the
    event loop of the first read)."""

    def __init__(self, config: SqlConnection, defs: Definitions, *, timeout: float, connections: int):
        self.config = _reader_connection(config, timeout)
        self.defs, self.where, self.timeout = defs, server_address(config), timeout
        self._pool = async_pool(self.config, max_size=connections, name="feature-reader")
        self._opened = False
        # callers wait here, not in the pool: its queue arms a timeout per waiter, which cost
        # a quarter of the requests/s of 64 clients over 4 connections (bench/README.md "Reads")
        self._slots = asyncio.Semaphore(connections)

    async def _open(self) -> None:
        if not self._opened:  # open() takes a lock each time: once is enough
            await self._pool.open()
            self._opened = True

    async def read(self, units: Sequence[Unit], features: dict[str, list[FeatureDef]], as_list: bool = False) -> dict[Unit, SourceRow]:
        found: dict[Unit, tuple[str, int]] = {}
        try:
            await self._open()
            async with (
                self._slots,
                asyncio.timeout(self.timeout * 2 + 1),
            ):  # the server's statement_timeout is the deadline; this bounds a lost peer
                async with self._pool.connection() as conn:
                    for query, keys, sources in _statements(self.defs, self.config.schema, units):
                        try:
                            cur = await conn.execute(query, (keys, sources))
                            rows = await cur.fetchall()
                        except psycopg.errors.UndefinedTable:
                            rows = []
                        _found(rows, found)
        except TimeoutError as exc:
            raise ReadTimeout(f"SQL store at {self.where} did not answer in time") from exc
        except PoolTimeout as exc:
            raise _no_connection(self.where, exc) from exc
        except psycopg.Error as exc:
            raise _store_error(self.where, self.config.statement_timeout_ms, exc) from exc
        return _rows(units, found, features, as_list)

    async def ping(self) -> None:
        await self._open()
        async with self._pool.connection() as conn:
            await conn.execute("SELECT 1")

    async def close(self) -> None:
        await self._pool.close()
