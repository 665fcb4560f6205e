"""What identifies the SQL store and what one of its entity tables holds, read cheaply at
any size, for the ledger to record after each write and for later steps to compare with
(jobs/operations/ledger/store_state.py).

- The server: PostgreSQL's ``system_identifier`` (fixed when the cluster was initialised;
  a restore into a new cluster or a failover to another changes it), CockroachDB's
  ``crdb_internal.cluster_id()``, and when the server started.
- The database's and the table's object ids: a database or table dropped and made again
  has new ones; on PostgreSQL the table's file node changes on ``TRUNCATE`` (and on
  ``VACUUM FULL``, which keeps the rows: the sample tells them apart).
- Rows of the source: counted when the table is small (its planner estimate below
  ROWS_COUNTED), else estimated from the planner's statistics (``pg_class.reltuples`` and
  the source's share in ``pg_stats``): a ``count(*)`` of a billion rows is not affordable.
- Whether a small sample of the entities a write wrote still have their row (one indexed
  query): the answer that decides, whatever the table's size.

Each query may be refused or unknown on one dialect: its value is then None. Nothing here
writes.
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
from psycopg import sql

from sinks.sql.config import SqlSinkConfig

log = logging.getLogger(__name__)

ROWS_COUNTED = 1_000_000
"""Tables the planner estimates below this many rows have the source's rows counted."""


def _one(conn: psycopg.Connection, query: str | sql.Composed, params: tuple = ()) -> Any:
    try:
        row = conn.execute(query, params).fetchone()
    except psycopg.Error as exc:  # not on this dialect, or not for this role
        log.debug("%s: %s", query, exc)
        return None
    return row[0] if row else None


def observe(conn: psycopg.Connection, config: SqlSinkConfig) -> dict[str, Any]:
    """``{"server", "started", "database", "table_oid", "filenode", "rows", "rows_estimated"}``
    of the source's table (None where unknown)."""
    dialect = config.dialect
    if dialect == "cockroach":
        server = _one(conn, "SELECT crdb_internal.cluster_id()::STRING")
    else:
        server = _one(conn, "SELECT system_identifier::text FROM pg_control_system()")
    started = _one(conn, "SELECT pg_postmaster_start_time()")
    table = _one(conn, "SELECT to_regclass(%s)::oid::bigint", (config.table_name,))
    out: dict[str, Any] = {
        "server": server,
        "started": started.isoformat() if started is not None else None,
        "database": _one(conn, "SELECT oid::bigint FROM pg_database WHERE datname = current_database()"),
        "table_oid": table,
        "filenode": None,
        "rows": None,
        "rows_estimated": False,
    }
    if table is None:
        return out
    if dialect != "cockroach":
        out["filenode"] = _one(conn, "SELECT pg_relation_filenode(%s::regclass)::bigint", (config.table_name,))
    estimate = _one(conn, "SELECT reltuples::bigint FROM pg_class WHERE oid = %s::oid", (table,))
    if estimate is None or estimate < ROWS_COUNTED:  # -1: never analysed (a new table)
        out["rows"] = _one(conn, sql.SQL("SELECT count(*) FROM {} WHERE source = %s").format(config.table_id), (config.source,))
        return out
    share = _one(
        conn,
        "SELECT freq FROM pg_stats s, unnest(s.most_common_vals::text::text[], s.most_common_freqs) AS m(val, freq) "
        "WHERE s.tablename = %s AND s.schemaname = COALESCE(%s, current_schema()) AND s.attname = 'source' AND m.val = %s",
        (config.table, config.schema, config.source),
    )
    out["rows"], out["rows_estimated"] = (int(estimate * share) if share is not None else None), True
    return out


def holding(conn: psycopg.Connection, config: SqlSinkConfig, keys: list[str]) -> int | None:
    """How many of the entities ``keys`` have a row of the source now (None: the table is gone)."""
    if not keys:
        return 0
    try:
        query = sql.SQL("SELECT count(*) FROM {} WHERE source = %s AND entity_key = ANY(%s)").format(config.table_id)
        row = conn.execute(query, (config.source, list(keys))).fetchone()
    except psycopg.errors.UndefinedTable:
        return None
    return int(row[0])
