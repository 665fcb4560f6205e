"""Reads from the SQL store (CockroachDB; PostgreSQL on the same wire): one query per
entity table per batch, ``entity_key = ANY(...)`` for the sources involved, the JSON maps
parsed with exact ints and turned back into the declared types. Connections are made by
the one SQL connection builder (stores/sql.py), on demand, and kept for the next read;
psycopg_pool was measured and left out (bench/README.md, "Installs, and the refactor behind them")."""

from __future__ import annotations

import asyncio
import json
import math
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace

import psycopg
from psycopg import sql

from feature_defs import Definitions, FeatureDef
from feature_reader.decode import BAD, JSON_OBJECT_BYTES, as_of_seconds, from_json
from feature_reader.errors import ReadTimeout, StoreError
from feature_reader.rows import BAD_AS_OF_ROW, NOT_FOUND_ROW, Layout, SourceRow, Unit
from fm_config.sql import SqlConnection
from stores.sql import connect, connect_async, is_transient, server_address, table_identifier

# the as-of time as a float8: a timestamptz may be 'infinity' (or past year 9999), which a
# bigint cast refuses, failing the whole batch; checked per row instead (decode.as_of_seconds)
LEGACY_QUERY = (
    "SELECT entity_key, source, features::text, extract(epoch FROM as_of)::float8 FROM {} WHERE entity_key = ANY(%s) AND source = ANY(%s)"
)
# A row past its expiry is not served, as Redis serves no expired key, whether or not the
# store's TTL job (CockroachDB) or `materialize cleanup` (PostgreSQL) deleted it yet.
QUERY = LEGACY_QUERY + " AND (expires_at IS NULL OR expires_at > now())"
LEGACY_RETRY_SECONDS = 60.0


class _Layouts:
    """Tables found without ``expires_at`` (made before it, not yet brought up to the layout by
    a run or the schema step): read without the filter, and asked again after a while."""

    def __init__(self) -> None:
        self._legacy: dict[str, float] = {}

    def query(self, table: str) -> str:
        since = self._legacy.get(table)
        if since is not None and time.monotonic() - since < LEGACY_RETRY_SECONDS:
            return LEGACY_QUERY
        self._legacy.pop(table, None)
        return QUERY

    def legacy(self, table: str) -> None:
        self._legacy[table] = time.monotonic()


def _statements(
    defs: Definitions, schema: str | None, units: Sequence[Unit], layouts: _Layouts
) -> list[tuple[str, sql.Composed, sql.Composed, list[str], list[str]]]:
    """Per table: its name, the query to send, the one without the expiry filter, keys, sources."""
    by_table: dict[str, tuple[set, set]] = defaultdict(lambda: (set(), set()))
    for unit in units:
        table = defs.entities[defs.sources[unit.source].entity].sql_table
        keys, sources = by_table[table]
        keys.add(unit.entity_id)
        sources.add(unit.source)
    out = []
    for t, (k, s) in by_table.items():
        name = table_identifier(t, schema)
        out.append((t, sql.SQL(layouts.query(t)).format(name), sql.SQL(LEGACY_QUERY).format(name), sorted(k), sorted(s)))
    return out


def _rows(units: Sequence[Unit], found: dict, features: dict[str, list[FeatureDef]], as_list: bool) -> dict[Unit, SourceRow]:
    names = {source: Layout([f.name for f in feats]) for source, feats in features.items()}
    # json values are Python objects several times their text (decode.JSON_OBJECT_BYTES): such rows' text counted so
    per_text_byte = {source: JSON_OBJECT_BYTES if any(f.type == "json" for f in feats) else 1 for source, feats in features.items()}
    out = {}
    for unit in units:
        hit = found.get(unit)
        if hit is None:
            out[unit] = NOT_FOUND_ROW
            continue
        text, stored = hit
        as_of = as_of_seconds(stored)
        if as_of is BAD:
            out[unit] = BAD_AS_OF_ROW
            continue
        try:
            doc = json.loads(text)  # exact ints, beyond 2^53 too
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
            doc = None
        feats = features[unit.source]
        if not isinstance(doc, dict):
            values = tuple(from_json(f, object()) for f in feats)  # every value BAD
        else:
            values = tuple(None if doc.get(f.stored_name) is None else from_json(f, doc[f.stored_name], as_list=as_list) for f in feats)
        complete = all(v is not None and v is not BAD for v in values)
        size = len(text) * per_text_byte[unit.source] + 48 * len(feats)
        out[unit] = SourceRow(as_of, values, names[unit.source], size, complete)
    return out


def _store_error(where: str, timeout_ms: int, exc: psycopg.Error) -> StoreError:
    if getattr(exc, "sqlstate", None) == "57014":
        return ReadTimeout(f"SQL store at {where} did not answer in {timeout_ms} ms")
    kind = "transient" if is_transient(exc) else "refused"
    return StoreError(f"SQL store at {where} ({kind}): {type(exc).__name__}: {str(exc).strip().splitlines()[0]}")


def _reader_connection(config: SqlConnection, timeout: float, connect_timeout: float) -> SqlConnection:
    # the server's statement timeout is a read's deadline; a connect has its own (whole
    # seconds, at least 2: libpq's unit and floor)
    return replace(
        config,
        statement_timeout_ms=max(1, int(timeout * 1000)),
        connect_timeout=max(2, math.ceil(connect_timeout)),
        application_name=config.application_name + "-reader",
    )


def _found(rows, found: dict) -> None:
    for key, source, text, as_of in rows:
        found[Unit(source, key)] = (text, as_of)


class SqlReads:
    """Synchronous reads over up to ``connections`` connections, kept between reads (thread-safe)."""

    def __init__(self, config: SqlConnection, defs: Definitions, *, timeout: float, connections: int, connect_timeout: float):
        self.config = _reader_connection(config, timeout, connect_timeout)
        self.defs, self.where = defs, server_address(config)
        self._idle: queue.LifoQueue = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(connections)
        self._layouts = _Layouts()

    def read(self, units: Sequence[Unit], features: dict[str, list[FeatureDef]], as_list: bool = False) -> dict[Unit, SourceRow]:
        found: dict[Unit, tuple[str, int]] = {}
        self._slots.acquire()
        conn = None
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = connect(self.config)  # a refused login or TLS failure: terminal, named
            for table, query, legacy, keys, sources in _statements(self.defs, self.config.schema, units, self._layouts):
                try:
                    rows = conn.execute(query, (keys, sources)).fetchall()
                except psycopg.errors.UndefinedTable:
                    rows = []  # nothing written to this table yet: every entity NOT_FOUND
                except psycopg.errors.UndefinedColumn:  # a table of the layout before expires_at
                    self._layouts.legacy(table)
                    rows = conn.execute(legacy, (keys, sources)).fetchall()
                _found(rows, found)
            self._idle.put(conn)
            conn = None
        except psycopg.Error as exc:
            raise _store_error(self.where, self.config.statement_timeout_ms, exc) from exc
        finally:
            if conn is not None:  # failed: may be broken, never reused
                conn.close()
            self._slots.release()
        return _rows(units, found, features, as_list)

    def warm(self) -> None:
        """Open a connection ahead of the first read (failures ignored: the first read connects then)."""
        if not self._slots.acquire(blocking=False):  # reads are under way: they open what they need
            return
        try:
            if self._idle.empty():
                self._idle.put(connect(self.config))
        except psycopg.Error:
            pass
        finally:
            self._slots.release()

    def ping(self) -> None:
        """SELECT 1 on one of the reader's connections (a new one only when none is idle, and
        kept); one found dropped is replaced once."""
        with self._slots:
            for attempt in (1, 2):
                try:
                    conn, kept = self._idle.get_nowait(), True
                except queue.Empty:
                    conn, kept = connect(self.config), False
                try:
                    conn.execute("SELECT 1")
                except psycopg.Error:
                    conn.close()
                    if not kept or attempt == 2:
                        raise
                    continue
                self._idle.put(conn)
                return

    def close(self) -> None:
        while not self._idle.empty():
            self._idle.get_nowait().close()


class AsyncSqlReads:
    """asyncio reads over up to ``connections`` async connections, kept between reads."""

    def __init__(self, config: SqlConnection, defs: Definitions, *, timeout: float, connections: int, connect_timeout: float):
        self.config = _reader_connection(config, timeout, connect_timeout)
        self.defs, self.where, self.timeout = defs, server_address(config), timeout
        self.connect_timeout = connect_timeout
        self._idle: list[psycopg.AsyncConnection] = []
        self._slots = asyncio.Semaphore(connections)
        self._layouts = _Layouts()

    async def read(self, units: Sequence[Unit], features: dict[str, list[FeatureDef]], as_list: bool = False) -> dict[Unit, SourceRow]:
        found: dict[Unit, tuple[str, int]] = {}
        async with self._slots:
            conn = None
            try:
                # a connect under its own timeout, not the read's
                conn = self._idle.pop() if self._idle else await self._connect()
                # the server's statement_timeout is the deadline; this bounds a lost peer
                async with asyncio.timeout(self.timeout * 2 + 1):
                    for table, query, legacy, keys, sources in _statements(self.defs, self.config.schema, units, self._layouts):
                        try:
                            cur = await conn.execute(query, (keys, sources))
                            rows = await cur.fetchall()
                        except psycopg.errors.UndefinedTable:
                            rows = []
                        except psycopg.errors.UndefinedColumn:
                            self._layouts.legacy(table)
                            rows = await (await conn.execute(legacy, (keys, sources))).fetchall()
                        _found(rows, found)
                self._idle.append(conn)
                conn = None
            except TimeoutError as exc:
                raise ReadTimeout(f"SQL store at {self.where} did not answer in time") from exc
            except psycopg.Error as exc:
                raise _store_error(self.where, self.config.statement_timeout_ms, exc) from exc
            finally:
                if conn is not None:
                    await conn.close()
        return _rows(units, found, features, as_list)

    async def _connect(self) -> psycopg.AsyncConnection:
        try:
            async with asyncio.timeout(self.connect_timeout + 1):  # libpq's own is in whole seconds
                return await connect_async(self.config)
        except TimeoutError:
            raise StoreError(
                f"SQL store at {self.where}: no connection within {self.connect_timeout * 1000:.0f} ms (reader.connect_timeout_ms)"
            ) from None

    async def warm(self) -> None:
        """Open a connection ahead of the first read (failures ignored: the first read connects then)."""
        if not self._idle:
            async with self._slots:
                try:
                    conn = await self._connect()
                except (psycopg.Error, StoreError):
                    return
                self._idle.append(conn)

    async def ping(self) -> None:
        """SELECT 1 on one of the reader's connections (a new one only when none is idle, and
        kept); one found dropped is replaced once."""
        async with self._slots:
            for attempt in (1, 2):
                kept = bool(self._idle)
                conn = self._idle.pop() if kept else await self._connect()
                try:
                    async with asyncio.timeout(self.timeout * 2 + 1):
                        await conn.execute("SELECT 1")
                except (psycopg.Error, TimeoutError):
                    await conn.close()
                    if not kept or attempt == 2:
                        raise
                    continue
                self._idle.append(conn)
                return

    async def close(self) -> None:
        while self._idle:
            await self._idle.pop().close()
