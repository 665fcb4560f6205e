"""Connections to the SQL store (CockroachDB, or PostgreSQL on the same wire): psycopg 3,
the server's statement timeout, TCP keepalives, and which errors a retry can fix.

Used by the writers on the executors and by every driver-side step (preflight, schema,
verify); the reader builds its connections here too.
"""

from __future__ import annotations

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from sinks.errors import TerminalSinkError, TransientSinkError
from sinks.sql import statements as stmts
from sinks.sql.config import SqlSinkConfig
from sinks.sql.statements import Dialect

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
        password=conf.auth_password(),
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
