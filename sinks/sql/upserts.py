"""The SQL upserts of one writer (CockroachDB, or PostgreSQL on the same wire): one JSON row per entity and source.

A writer opens one psycopg 3 connection. Rows arrive sorted by key; a statement is a
multi-row upsert of ``batch_rows`` distinct keys (CockroachDB rejects an upsert that
names one key twice), and ``statements_per_transaction`` statements go out pipelined in
one short transaction: committing each statement on its own is bound by the server's
fsync (about half the rate, measured by `python -m bench`). With 1, each statement is its
own transaction (with the expiry step below, when there is one). Every statement is a
full-row upsert and can be repeated, so after a dropped connection or a serialization
failure the sink reconnects and sends the same transaction again. Each row expires its TTL after the write (the seconds its Redis key
gets), and, when other sources write the entity type too, the transaction ends by moving
the expiry of the written entities' rows of other sources to theirs (statements.follow_expiry):
the entity's TTL, as in Redis.

Driver-side steps (:mod:`sinks.sql.preflight`) run before any partition writes.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql

from serializers.keys import ttl_with_jitter
from sinks.base import SqlWriteStats
from sinks.errors import TerminalSinkError, TransientSinkError
from sinks.retry import call_with_retries
from sinks.sql import statements as stmts
from sinks.sql.config import SqlSinkConfig
from stores.sql import connect, is_transient

log = logging.getLogger(__name__)


class SqlSink:
    """Buffers sorted (key, json) rows; upserts them ``batch_rows`` per statement, a few statements per transaction."""

    def __init__(self, conf: SqlSinkConfig):
        self.conf = conf
        self.stats = SqlWriteStats()
        self._conn: psycopg.Connection | None = None
        self._keys: list[str] = []
        self._maps: list[str] = []
        self._as_ofs: list[dt.datetime] = []
        self._ttls: list[int | None] = []
        self._statements: dict[tuple[int, bool], sql.Composed] = {}
        self._follow = stmts.follow_expiry(conf.table_id)
        self._as_of = dt.datetime.fromtimestamp(conf.as_of, dt.UTC)
        self._horizon = dt.datetime.fromtimestamp(conf.horizon, dt.UTC)

    def __enter__(self) -> SqlSink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        self._conn = self._with_retries(lambda: connect(self.conf), "connect")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def write_batch(self, keys: pa.Array, docs: pa.Array, as_ofs: pa.Array | None = None) -> SqlWriteStats:
        """Queue a batch of rows sorted by key (entity ids, JSON objects, and for range runs each
        row's as-of epoch seconds, or timestamps to the microsecond, instead of the config's); full transactions go out as they fill.

        A key repeated in a row (within the batch or across batches) is sent once: its last
        row wins, counted in ``duplicates``."""
        if len(keys) == 0:
            return self.stats
        # the last row of each run of equal keys
        last = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1)).to_numpy(zero_copy_only=False)
        kept = np.flatnonzero(np.append(last, True))
        key_list = keys.take(kept).to_pylist()
        doc_list = docs.take(kept).to_pylist()
        if as_ofs is None:
            stamps = [self._as_of] * len(key_list)
        elif pa.types.is_timestamp(as_ofs.type):  # to the microsecond (a source selected by event time)
            stamps = as_ofs.take(kept).cast(pa.timestamp("us", tz="UTC")).to_pylist()
        else:
            micros = pc.multiply(as_ofs.take(kept).cast(pa.int64()), 1_000_000)
            stamps = micros.cast(pa.timestamp("us", tz="UTC")).to_pylist()
        ttls = self._ttls_of(key_list)
        self.stats.duplicates += len(keys) - len(kept)
        if self._keys and self._keys[-1] == key_list[0]:
            # the previous batch ended with this key: its row is replaced
            self._maps[-1], self._as_ofs[-1] = doc_list[0], stamps[0]
            key_list, doc_list, stamps, ttls = key_list[1:], doc_list[1:], stamps[1:], ttls[1:]
            self.stats.duplicates += 1
        self._keys += key_list
        self._maps += doc_list
        self._as_ofs += stamps
        self._ttls += ttls
        while len(self._keys) > self._per_transaction:
            # Keep the newest row buffered: the next batch may repeat its key.
            self._send(self._per_transaction)
        return self.stats

    def _ttls_of(self, keys: list[str]) -> list[int | None]:
        """Each row's TTL in seconds (None: the entity type has none): its Redis key's."""
        c = self.conf
        if not c.ttl_seconds:
            return [None] * len(keys)
        prefix = c.key_prefix.encode("utf-8")
        return [ttl_with_jitter(prefix + k.encode("utf-8"), c.ttl_seconds, c.ttl_jitter) for k in keys]

    def add(self, key: str, features_json: str, as_of: int | None = None) -> None:
        """Queue one row (``write_batch`` of one)."""
        self.write_batch(pa.array([key]), pa.array([features_json]), None if as_of is None else pa.array([as_of], pa.int64()))

    @property
    def _per_transaction(self) -> int:
        return self.conf.batch_rows * self.conf.statements_per_transaction

    def flush(self) -> None:
        while self._keys:
            self._send(min(len(self._keys), self._per_transaction))

    def _statement(self, rows: int, beyond_horizon: bool = False) -> sql.Composed:
        if (rows, beyond_horizon) not in self._statements:
            self._statements[rows, beyond_horizon] = stmts.upsert(self.conf.table_id, rows, beyond_horizon)
        return self._statements[rows, beyond_horizon]

    def _upserts(self, cur: psycopg.Cursor, full: list, last: list | None, rows: int, beyond_horizon: bool) -> list[str]:
        """The transaction's statements (full ones pipelined, then a shorter last one); the keys written.
        ``beyond_horizon``: the same rows again, replacing only stored rows beyond the horizon."""
        size, extra = self.conf.batch_rows, [self._horizon] if beyond_horizon else []
        written: list[str] = []
        if full:
            groups = [[*group, *extra] for group in full] if extra else full
            cur.executemany(self._statement(size, beyond_horizon), groups, returning=True)  # pipelined: one round trip
            while True:  # one result per statement: the keys it wrote
                written += [r[0] for r in cur.fetchall()]
                if not cur.nextset():
                    break
        if last is not None:
            cur.execute(self._statement(rows % size, beyond_horizon), [*last, *extra])
            written += [r[0] for r in cur.fetchall()]
        return written

    def _send(self, rows: int) -> None:
        """Upsert the first ``rows`` buffered rows: full statements, then a shorter last one."""
        size = self.conf.batch_rows
        params: list[list[Any]] = []
        for first in range(0, rows, size):
            group: list[Any] = []
            for i in range(first, min(rows, first + size)):
                group += (self._keys[i], self.conf.source, self._maps[i], self._as_ofs[i], self._ttls[i])
            params.append(group)
        full = params if rows % size == 0 else params[:-1]
        last = None if rows % size == 0 else params[-1]

        def execute() -> tuple[int, int | None, int]:
            """Rows the upsert wrote; rows it left (they hold a later as_of) that were beyond
            the horizon and replaced by the second upsert (None: not needed), the others
            holding a newer snapshot; and rows of other sources whose expiry followed."""
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.conf)
                self.stats.reconnects += 1
            conn = self._conn
            if len(params) == 1 and not self.conf.follow_expiry:  # one statement: its own implicit transaction
                written = len(conn.execute(self._statement(rows), params[0]).fetchall())
                if written == rows:
                    return written, None, 0
                return written, len(conn.execute(self._statement(rows, True), [*params[0], self._horizon]).fetchall()), 0
            with conn.transaction(), conn.cursor() as cur:
                written = self._upserts(cur, full, last, rows, False)
                replaced = None if len(written) == rows else self._upserts(cur, full, last, rows, True)
                keys = written + (replaced or [])
                if not keys or not self.conf.follow_expiry:
                    return len(written), None if replaced is None else len(replaced), 0
                cur.execute(self._follow, {"keys": keys, "source": self.conf.source})
                return len(written), None if replaced is None else len(replaced), cur.rowcount

        keys = self._keys
        written, replaced, followed = self._with_retries(execute, f"batch of {rows} rows, keys {keys[0]!r}..{keys[rows - 1]!r}")
        del self._keys[:rows], self._maps[:rows], self._as_ofs[:rows], self._ttls[:rows]
        self.stats.statements += len(params) * (1 if replaced is None else 2)
        replaced = replaced or 0
        self.stats.rows_upserted += written + replaced
        self.stats.rows_skipped_newer += rows - written - replaced
        self.stats.rows_replaced_future += replaced
        self.stats.expiry_followed += followed
        self.stats.transactions += 1

    def _on_retry(self, attempt: int, exc: BaseException) -> None:
        self.stats.retries += 1
        log.warning("%s: transient error, attempt %d of %d: %s", self.conf.table_name, attempt + 1, self.conf.retries + 1, exc)
        if self._conn is not None and self._conn.broken:
            self._conn.close()
            self._conn = None

    def _with_retries(self, fn, what: str):
        try:
            return call_with_retries(
                fn,
                is_transient=is_transient,
                retries=self.conf.retries,
                base_delay=self.conf.retry_base_delay,
                max_delay=self.conf.retry_max_delay,
                on_retry=self._on_retry,
            )
        except psycopg.Error as exc:
            state = exc.sqlstate or "no SQLSTATE"
            if is_transient(exc):  # as for Redis: a later run (or task retry) may succeed
                raise TransientSinkError(
                    f"table {self.conf.table_name}: {what} still failing after {self.conf.retries + 1} attempts: "
                    f"[{state}] {str(exc).strip()}"
                ) from exc
            raise TerminalSinkError(f"table {self.conf.table_name}: {what} failed (not retried): [{state}] {str(exc).strip()}") from exc
