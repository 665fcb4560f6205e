"""SQL sink (CockroachDB, or PostgreSQL on the same wire): one JSON row per entity and source.

A writer opens one psycopg 3 connection. Rows arrive sorted by key; a statement is a
multi-row upsert of ``batch_rows`` distinct keys (CockroachDB rejects an upsert that
names one key twice), and ``statements_per_transaction`` statements go out pipelined in
one short transaction: committing each statement on its own is bound by the server's
fsync (about half the rate, measured by `python -m bench`). With 1, each statement is its
own implicit transaction. Every statement is a full-row upsert and can be repeated, so
after a dropped connection or a serialization failure the sink reconnects and sends the
same transaction again.

Driver-side steps (:func:`ensure_schema`, :func:`pre_split`) run before any partition
writes, never inside partitions.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from sinks import sql_statements as stmts
from sinks.errors import TerminalSinkError, TransientSinkError
from sinks.retry import call_with_retries
from sinks.sql_statements import Dialect

log = logging.getLogger(__name__)

# Worth another attempt: serialization failure, deadlock, CockroachDB's "result is
# ambiguous", the server shutting the session down (pg_terminate_backend, restarts),
# a statement or lock timeout, and the whole connection-exception class 08.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "40003", "55P03", "57P01", "57P02", "57P03", "57014"})


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, TransientSinkError):
        return True
    if not isinstance(exc, psycopg.Error):
        return False
    state = exc.sqlstate
    if state is None:
        # No SQLSTATE: the client lost the connection (closed, reset, timed out), or the
        # connection could not be set up (TLS, login, a missing role or database): no retry fixes that.
        return isinstance(exc, psycopg.OperationalError) and _setup_problem(str(exc)) is None
    return state in TRANSIENT_SQLSTATES or state.startswith("08")


@dataclass(frozen=True)
class SqlSinkConfig:
    dsn: str
    """libpq connection string or postgresql:// URL, without a password."""
    table: str
    source: str
    as_of: int
    """Snapshot as-of time, UTC epoch seconds."""
    dialect: Dialect
    schema: str | None = None
    batch_rows: int = 25
    """Rows per upsert statement."""
    statements_per_transaction: int = 20
    """Statements pipelined in one transaction (1: each statement commits on its own)."""
    statement_timeout_ms: int = 30_000
    connect_timeout: int = 10
    retries: int = 5
    """Further attempts of a transaction after a transient error."""
    retry_base_delay: float = 0.2
    retry_max_delay: float = 5.0
    application_name: str = "feature-materializer"
    password: str | None = field(default=None, repr=False)

    @property
    def table_id(self) -> sql.Identifier:
        return stmts.table_identifier(self.table, self.schema)

    @property
    def table_name(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table


@dataclass
class SqlWriteStats:
    rows_upserted: int = 0
    """Rows written (inserted, or replacing an older or equal snapshot)."""
    rows_skipped_newer: int = 0
    """Rows left as they were: the table holds a newer snapshot of the entity and source."""
    duplicates: int = 0
    """Repeated keys in the input; the last row of a key wins."""
    statements: int = 0
    transactions: int = 0
    retries: int = 0
    reconnects: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# libpq's words for a TLS setup that no retry can fix. Such errors carry no SQLSTATE, so
# is_transient would take them for a lost connection and retry them.
_TLS_VERIFY_FAILED = ("certificate verify failed", "does not match host name")
# A refused login has no SQLSTATE either; retrying it only delays the error.
_AUTH_FAILED = ("password authentication failed", "no pg_hba.conf entry", "password is required")
_TLS_SETUP_FAILED = ("root certificate file", "server does not support SSL", "certificate file", "private key file", "tlsv1 alert", "sslv3 alert")
# PostgreSQL refuses the login the same way (no SQLSTATE) when the dsn's role or database
# does not exist on that server (`FATAL:  role "x" does not exist`); no retry creates them.
_MISSING = {
    "role": "check the user in sql.dsn (or --sql-dsn), and that this role was created on that server: conf/base/sql-grants.sql",
    "database": "check the database name in sql.dsn (or --sql-dsn), and that it was created on that server",
}


def _setup_problem(text: str) -> tuple[str, str] | None:
    """(what failed, what to check) when ``text`` is a TLS or login failure, which no retry fixes."""
    if any(m in text for m in _TLS_VERIFY_FAILED):
        return "TLS certificate verification failed", "check sslmode and sslrootcert in sql.dsn"
    if any(m in text for m in _TLS_SETUP_FAILED):
        return "TLS setup failed", "check sslmode and sslrootcert in sql.dsn"
    if any(m in text for m in _AUTH_FAILED):
        return "login refused", "check the user in sql.dsn and its password"
    for kind, hint in _MISSING.items():
        name, missing, _ = text.partition(f'{kind} "')[2].rpartition('" does not exist')
        if missing:
            return f"{kind} {name!r} does not exist", hint
    return None


def setup_failure(conf: SqlSinkConfig, exc: psycopg.Error) -> TerminalSinkError | None:
    """A terminal error naming the server when ``exc`` is a TLS or login failure (a refused password,
    a missing role or database: no retry helps), else None."""
    text = str(exc).strip()
    problem = _setup_problem(text)
    if problem is None:
        return None
    what, hint = problem
    parts = conninfo_to_dict(conf.dsn)  # the dsn holds no password (SqlConf refuses one)
    where = f"{parts.get('host') or 'the default host'}:{parts.get('port') or 5432}"
    return TerminalSinkError(f"SQL store at {where}: {what} (not retried; {hint}): {text}")


def connect(conf: SqlSinkConfig) -> psycopg.Connection:
    try:
        conn = _open(conf)
    except psycopg.OperationalError as exc:
        failure = setup_failure(conf, exc)
        if failure is None:
            raise
        raise failure from exc
    try:
        conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(conf.statement_timeout_ms)))
    except BaseException:
        conn.close()
        raise
    return conn


def _open(conf: SqlSinkConfig) -> psycopg.Connection:
    return psycopg.connect(
        conf.dsn,
        password=conf.password,
        autocommit=True,
        application_name=conf.application_name,
        connect_timeout=conf.connect_timeout,
        # statement_timeout is enforced by the server; these notice a peer that vanished
        # without a reset (a dead node, a partition) instead of waiting on TCP for minutes.
        keepalives=1,
        keepalives_idle=30,
        keepalives_interval=10,
        keepalives_count=3,
        tcp_user_timeout=conf.statement_timeout_ms + 10_000,
    )


def detect_dialect(conn: psycopg.Connection) -> Dialect:
    row = conn.execute("SELECT version()").fetchone()
    return stmts.dialect_from_version(row[0] if row else "")


SCHEMA_STEP = "materialize schema --env <env>"
"""The command that creates the entity tables, under a role that may (conf/README.md "Least privilege")."""


def table_columns(conn: psycopg.Connection, conf: SqlSinkConfig) -> set[str]:
    """The entity table's columns as this role sees them: none when the table is missing,
    or when the role holds no privilege on it (information_schema shows only those)."""
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND table_schema = COALESCE(%s, current_schema())",
        (conf.table, conf.schema),
    )
    return {r[0] for r in rows}


def ensure_schema(conn: psycopg.Connection, conf: SqlSinkConfig) -> bool:
    """Check the entity table's columns; create the table only when it is missing.

    Checking first lets a writer role without CREATE on the schema run: PostgreSQL 15
    refuses it CREATE TABLE IF NOT EXISTS even when the table exists. Returns whether
    the table was created here."""
    created = False
    try:
        found = table_columns(conn, conf)
        if not found:
            conn.execute(stmts.create_table(conf.table_id, conf.dialect))
            created = True
            found = table_columns(conn, conf)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise TerminalSinkError(
            f"table {conf.table_name} does not exist (or this role has no privilege on it) and this role may not create it "
            f"([{exc.sqlstate}] {exc.diag.message_primary or str(exc).strip()}): run the schema step, `{SCHEMA_STEP}`, under a role that may create tables, "
            "and grant this role the writer's privileges (conf/base/sql-grants.sql)"
        ) from exc
    except psycopg.Error as exc:
        if is_transient(exc):
            raise  # the caller retries a dropped connection or a restart
        raise TerminalSinkError(f"schema step for table {conf.table_name} failed: [{exc.sqlstate or 'no SQLSTATE'}] {str(exc).strip()}") from exc
    if not found:  # CREATE ... IF NOT EXISTS skipped a table this role cannot see
        raise TerminalSinkError(
            f"table {conf.table_name} exists but this role holds no privilege on it: grant it SELECT, INSERT, UPDATE (conf/base/sql-grants.sql)"
        )
    missing = [c for c in stmts.COLUMNS if c not in found]
    if missing:
        raise TerminalSinkError(
            f"table {conf.table_name} exists without the column(s) {', '.join(missing)} "
            f"(found {', '.join(sorted(found))}); expected the layout in serializers/FORMAT.md 'SQL layout'"
        )
    lacking = missing_privileges(conn, conf)
    if lacking:
        raise TerminalSinkError(
            f"table {conf.table_name}: this role lacks {', '.join(lacking)} on it, which the upsert needs: "
            "grant it SELECT, INSERT, UPDATE (conf/base/sql-grants.sql)"
        )
    return created


def missing_privileges(conn: psycopg.Connection, conf: SqlSinkConfig) -> list[str]:
    """Which of SELECT, INSERT, UPDATE this role lacks on the table (checked before any store
    is written, so a read-only role does not fail halfway through the run)."""
    try:
        row = conn.execute(
            "SELECT has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'), has_table_privilege(c.oid, 'UPDATE') "
            "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = %s AND n.nspname = COALESCE(%s, current_schema())",
            (conf.table, conf.schema),
        ).fetchone()
    except psycopg.Error as exc:  # a server without these catalogs: the write itself will tell
        log.warning("%s: could not check privileges: %s", conf.table_name, exc)
        return []
    return [name for name, ok in zip(("SELECT", "INSERT", "UPDATE"), row or (True, True, True)) if not ok]


def pre_split(conn: psycopg.Connection, conf: SqlSinkConfig, keys: Sequence[str], expires: dt.datetime) -> int:
    """CockroachDB only: split at ``keys`` before the write. Returns the splits made."""
    if conf.dialect != "cockroach" or not keys:
        return 0
    conn.execute(stmts.split_at(conf.table_id, keys, expires))
    return len(keys)


class SqlSink:
    """Buffers sorted (key, json) rows; upserts them ``batch_rows`` per statement, a few statements per transaction."""

    def __init__(self, conf: SqlSinkConfig):
        self.conf = conf
        self.stats = SqlWriteStats()
        self._conn: psycopg.Connection | None = None
        self._keys: list[str] = []
        self._maps: list[str] = []
        self._as_ofs: list[dt.datetime] = []
        self._statements: dict[int, sql.Composed] = {}
        self._as_of = dt.datetime.fromtimestamp(conf.as_of, dt.UTC)

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
        row's as-of epoch instead of the config's); full transactions go out as they fill.

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
        else:
            micros = pc.multiply(as_ofs.take(kept).cast(pa.int64()), 1_000_000)
            stamps = micros.cast(pa.timestamp("us", tz="UTC")).to_pylist()
        self.stats.duplicates += len(keys) - len(kept)
        if self._keys and self._keys[-1] == key_list[0]:
            # the previous batch ended with this key: its row is replaced
            self._maps[-1], self._as_ofs[-1] = doc_list[0], stamps[0]
            key_list, doc_list, stamps = key_list[1:], doc_list[1:], stamps[1:]
            self.stats.duplicates += 1
        self._keys += key_list
        self._maps += doc_list
        self._as_ofs += stamps
        while len(self._keys) > self._per_transaction:
            # Keep the newest row buffered: the next batch may repeat its key.
            self._send(self._per_transaction)
        return self.stats

    def add(self, key: str, features_json: str, as_of: int | None = None) -> None:
        """Queue one row (``write_batch`` of one)."""
        self.write_batch(pa.array([key]), pa.array([features_json]), None if as_of is None else pa.array([as_of], pa.int64()))

    @property
    def _per_transaction(self) -> int:
        return self.conf.batch_rows * self.conf.statements_per_transaction

    def flush(self) -> None:
        while self._keys:
            self._send(min(len(self._keys), self._per_transaction))

    def _statement(self, rows: int) -> sql.Composed:
        if rows not in self._statements:
            self._statements[rows] = stmts.upsert(self.conf.table_id, rows)
        return self._statements[rows]

    def _send(self, rows: int) -> None:
        """Upsert the first ``rows`` buffered rows: full statements, then a shorter last one."""
        size = self.conf.batch_rows
        params: list[list[Any]] = []
        for first in range(0, rows, size):
            group: list[Any] = []
            for i in range(first, min(rows, first + size)):
                group += (self._keys[i], self.conf.source, self._maps[i], self._as_ofs[i])
            params.append(group)
        full = params if rows % size == 0 else params[:-1]
        last = None if rows % size == 0 else params[-1]

        def execute() -> int:
            """Rows written; the others hold a newer snapshot (the upsert's WHERE left them)."""
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.conf)
                self.stats.reconnects += 1
            conn = self._conn
            if len(params) == 1:  # one statement: its own implicit transaction
                return conn.execute(self._statement(rows), params[0]).rowcount
            written = 0
            with conn.transaction(), conn.cursor() as cur:
                if full:
                    cur.executemany(self._statement(size), full)  # pipelined: one round trip
                    written += cur.rowcount  # summed over the statements
                if last is not None:
                    cur.execute(self._statement(rows % size), last)
                    written += cur.rowcount
            return written

        keys = self._keys
        written = self._with_retries(execute, f"batch of {rows} rows, keys {keys[0]!r}..{keys[rows - 1]!r}")
        del self._keys[:rows], self._maps[:rows], self._as_ofs[:rows]
        self.stats.rows_upserted += written
        self.stats.rows_skipped_newer += rows - written
        self.stats.statements += len(params)
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
            kind = f"still failing after {self.conf.retries + 1} attempts" if is_transient(exc) else "failed (not retried)"
            raise TerminalSinkError(f"table {self.conf.table_name}: {what} {kind}: [{state}] {str(exc).strip()}") from exc
