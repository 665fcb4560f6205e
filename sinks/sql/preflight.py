"""Driver side, before any store is written: the dialect, the entity table (created only
when missing, brought up to the layout when it lacks ``expires_at``, its columns and this
role's privileges checked), and on CockroachDB the row-level TTL and the pre-split at key
quantiles. Never inside partitions.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import replace

import psycopg
from psycopg.conninfo import conninfo_to_dict

from fm_config.sql import SqlSettings
from serializers.description import SQL_TABLE
from sinks.errors import TerminalSinkError
from sinks.retry import call_with_retries
from sinks.sql import statements as stmts
from sinks.sql.config import SqlSinkConfig
from sinks.sql.description import create_description_table
from sinks.sql.statements import Dialect
from stores.sql import connect, is_transient

log = logging.getLogger(__name__)


def preflight(settings: SqlSettings, config: SqlSinkConfig, warnings: list[str]) -> SqlSinkConfig:
    """Connect, learn the dialect, check the entity table: the config the writers get. A
    table the writer may not use stops the run here, with nothing written to either store."""

    notes: list[str] = []

    def check() -> SqlSinkConfig:
        notes.clear()
        with connect(config) as conn:
            checked = replace(config, dialect=dialect_of(settings, conn))
            ensure_schema(conn, checked, notes)
            return checked

    try:
        # a server restarting right now gets the same bounded retries as the write
        checked = call_with_retries(
            check,
            is_transient=is_transient,
            retries=settings.retries,
            base_delay=settings.retry_base_delay,
            max_delay=settings.retry_max_delay,
        )
    except psycopg.Error as exc:
        raise TerminalSinkError(f"cannot connect to the SQL store ({settings.dsn}): {str(exc).strip()}") from exc
    warnings += [f"table {checked.table_name}: {note}" for note in notes]
    if conninfo_to_dict(settings.dsn).get("sslmode", "prefer") != "verify-full" and not is_loopback(settings.dsn):
        warnings.append(f"sql.dsn does not use sslmode=verify-full: the SQL store's certificate is not verified ({settings.dsn})")
    return checked


def is_loopback(dsn: str) -> bool:
    host = conninfo_to_dict(dsn).get("host") or "localhost"
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("/")


def detect_dialect(conn: psycopg.Connection) -> Dialect:
    row = conn.execute("SELECT version()").fetchone()
    return stmts.dialect_from_version(row[0] if row else "")


def dialect_of(settings: SqlSettings, conn: psycopg.Connection) -> Dialect:
    """The configured dialect, or (auto) the server's."""
    return detect_dialect(conn) if settings.dialect == "auto" else settings.dialect


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


def ensure_schema(conn: psycopg.Connection, conf: SqlSinkConfig, notes: list[str] | None = None) -> bool:
    """Check the entity table's columns; create the table only when it is missing, and add
    ``expires_at`` to a table made before it (serializers/FORMAT.md, "SQL layout").

    Checking first lets a writer role without CREATE on the schema run: PostgreSQL 15
    refuses it CREATE TABLE IF NOT EXISTS even when the table exists. Returns whether
    the table was created here; ``notes`` gets what else was changed, or should be."""
    created = False
    found: set[str] = set()
    try:
        found = table_columns(conn, conf)
        if not found:
            conn.execute(stmts.create_table(conf.table_id, conf.dialect))
            created = True
            found = table_columns(conn, conf)
        elif "expires_at" not in found and set(stmts.COLUMNS) - {"expires_at"} <= found:
            for statement in stmts.add_expiry_column(conf.table_id, conf.ttl_seconds):
                conn.execute(statement)
            found = table_columns(conn, conf)
            if notes is not None:
                expiry = f"in {conf.ttl_seconds:,} s from now" if conf.ttl_seconds else "never (no TTL)"
                notes.append(f"added column expires_at (the entity TTL); its rows expire {expiry}")
    except psycopg.errors.InsufficientPrivilege as exc:
        what = "has no column expires_at (the entity TTL's)" if found else "does not exist (or this role has no privilege on it)"
        raise TerminalSinkError(
            f"table {conf.table_name} {what} and this role may not {'alter' if found else 'create'} it "
            f"([{exc.sqlstate}] {exc.diag.message_primary or str(exc).strip()}): "
            f"run the schema step, `{SCHEMA_STEP}`, under {'the role that owns it' if found else 'a role that may create tables'}, "
            "and grant this role the writer's privileges (conf/base/sql-grants.sql)"
        ) from exc
    except psycopg.Error as exc:
        if is_transient(exc):
            raise  # the caller retries a dropped connection or a restart
        raise TerminalSinkError(
            f"schema step for table {conf.table_name} failed: [{exc.sqlstate or 'no SQLSTATE'}] {str(exc).strip()}"
        ) from exc
    if not found:  # CREATE ... IF NOT EXISTS skipped a table this role cannot see
        raise TerminalSinkError(
            f"table {conf.table_name} exists but this role holds no privilege on it: "
            "grant it SELECT, INSERT, UPDATE (conf/base/sql-grants.sql)"
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
    if conf.dialect == "cockroach" and not created:
        ensure_row_ttl(conn, conf, notes)
    ensure_description_table(conn, conf)
    return created


def ensure_description_table(conn: psycopg.Connection, conf: SqlSinkConfig) -> None:
    """The table ``stored_names`` beside the entity tables (serializers/FORMAT.md "The stores'
    description"): created when missing; a role that may not create it is told the schema step."""
    rows = conn.execute(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s AND table_schema = COALESCE(%s, current_schema())",
        (SQL_TABLE, conf.schema),
    ).fetchall()
    if rows:
        return
    try:
        conn.execute(create_description_table(conf.schema, conf.dialect))
    except psycopg.errors.InsufficientPrivilege as exc:
        raise TerminalSinkError(
            f"table {SQL_TABLE} (what the entity tables hold) does not exist, or this role has no privilege on it, and this "
            f"role may not create it ([{exc.sqlstate}] {exc.diag.message_primary or str(exc).strip()}): run the schema step, "
            f"`{SCHEMA_STEP}`, and grant this role the writer's privileges (conf/base/sql-grants.sql)"
        ) from exc


def has_row_ttl(conn: psycopg.Connection, conf: SqlSinkConfig) -> bool:
    """CockroachDB: whether the table's TTL job deletes rows by ``expires_at`` (its storage
    parameters, which CockroachDB shows in pg_class.reloptions)."""
    rows = conn.execute(
        "SELECT c.reloptions FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = %s AND n.nspname = COALESCE(%s, current_schema())",
        (conf.table, conf.schema),
    ).fetchall()
    return any(o.startswith("ttl_expiration_expression=") and "expires_at" in o for (options,) in rows for o in options or ())


def ensure_row_ttl(conn: psycopg.Connection, conf: SqlSinkConfig, notes: list[str] | None) -> None:
    """CockroachDB: set the row-level TTL on a table that lacks it; a role that may not is told
    (readers never serve expired rows, but the table keeps them until the schema step runs)."""
    try:
        if has_row_ttl(conn, conf):
            return
        conn.execute(stmts.set_row_ttl(conf.table_id))
        if notes is not None:
            notes.append("row-level TTL on expires_at set")
    except psycopg.errors.InsufficientPrivilege:
        if notes is not None:
            notes.append(
                "no row-level TTL: expired rows are not served but stay stored; "
                f"run the schema step, `{SCHEMA_STEP}`, under the table owner"
            )


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
