"""Cleanup of the SQL store: what no reader may serve and no run rewrites, out of one entity table.

Three kinds, all found in the table itself (no ledger needed: a SQL table can be walked,
unlike a Redis keyspace the job may not SCAN):

- rows of sources no longer defined for the entity type;
- rows past their expiry (``expires_at``, the entity TTL: serializers/FORMAT.md "SQL layout").
  PostgreSQL has no TTL of its own: this is what deletes them there; on CockroachDB its TTL
  job does too, and this takes whatever it has not reached yet;
- JSON keys no feature of the row's source is stored under any more (removed features, and
  the old stored names of features now stored under another: ``stored_as``).

The table is walked in primary-key order, a page of ``sql.batch_rows *
sql.statements_per_transaction`` rows per transaction, each statement bounded to the page's
key range, so no statement holds many locks or runs long, and a run beside it loses
nothing: each condition is checked again by the statement that deletes, so a row a run
rewrites meanwhile is kept. A transient error repeats the page. ``--dry-run`` counts the
same, read-only.
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import partial

import psycopg
from psycopg import sql

from feature_defs import Definitions
from fm_config import RunConf
from jobs.operations.ledger.events import sink_targets
from sinks.errors import TerminalSinkError
from sinks.retry import call_with_retries
from sinks.sql.config import SqlSinkConfig, sql_sink_config
from sinks.sql.preflight import table_columns
from stores.errors import MaterializerError
from stores.sql import connect, is_transient

CLEANUP_ROLE = "fm_cleanup"
"""The role conf/base/sql-grants.sql gives what cleanup needs: SELECT, UPDATE, DELETE."""


class SqlCleanupError(TerminalSinkError):
    """The SQL store cannot be cleaned as configured (a privilege, the table's layout)."""


@dataclass(frozen=True)
class SqlCleanupPlan:
    entity: str
    config: SqlSinkConfig
    """The entity table and how to reach it."""
    stored: dict[str, tuple[str, ...]]
    """Per source defined for the entity type: the names its features are stored under."""
    target: str = ""
    """The SQL store cleaned (server, database, schema; no secrets), as the ledger records it."""

    def describe(self) -> str:
        sources = ", ".join(sorted(self.stored)) or "none"
        return (
            f"cleanup of table {self.config.table_name}" + (f" in {self.target}" if self.target else "") + "\n"
            f"  deletes rows past their expiry, and rows of sources other than the defined ones ({sources})\n"
            f"  removes JSON keys no feature of the row's source is stored under"
        )


@dataclass
class _Page:
    """What one page did; added to the result only once its transaction committed."""

    expired: int = 0
    removed: Counter = field(default_factory=Counter)
    keys: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    stripped: int = 0


@dataclass
class SqlCleanupResult:
    """What a cleanup of the SQL table did (or, dry run, would do)."""

    table: str
    dry_run: bool = False
    rows_visited: int = 0
    pages: int = 0
    expired_rows: int = 0
    removed_sources: dict[str, int] = field(default_factory=dict)
    """Source no longer defined -> its rows deleted."""
    keys_removed: dict[str, dict[str, int]] = field(default_factory=dict)
    """Defined source -> JSON key no longer stored -> rows it was removed from."""
    rows_stripped: int = 0
    seconds: float = 0.0
    error: Exception | None = None

    @property
    def rows_deleted(self) -> int:
        return self.expired_rows + sum(self.removed_sources.values())

    @property
    def keys_removed_total(self) -> int:
        return sum(n for names in self.keys_removed.values() for n in names.values())

    def record(self) -> dict:
        """The ledger's record of it (the cleanup entry's ``cleanup.sql``)."""
        return {
            "table": self.table, "rows_visited": self.rows_visited, "pages": self.pages, "expired_rows": self.expired_rows,
            "removed_sources": self.removed_sources, "keys_removed": self.keys_removed, "rows_stripped": self.rows_stripped,
            "seconds": round(self.seconds, 3), "error": f"{type(self.error).__name__}: {self.error}" if self.error else None,
        }  # fmt: skip

    def add(self, page: _Page, visited: int) -> None:
        self.pages += 1
        self.rows_visited += visited
        self.expired_rows += page.expired
        for source, n in page.removed.items():
            self.removed_sources[source] = self.removed_sources.get(source, 0) + n
        for source, names in page.keys.items():
            held = self.keys_removed.setdefault(source, {})
            for name, n in names.items():
                held[name] = held.get(name, 0) + n
        self.rows_stripped += page.stripped

    def describe(self) -> list[str]:
        verb = ("would delete", "would remove") if self.dry_run else ("deleted", "removed")
        removed = ", ".join(f"{s}: {n:,}" for s, n in sorted(self.removed_sources.items()))
        keys = ", ".join(f"{s}.{k}: {n:,}" for s, names in sorted(self.keys_removed.items()) for k, n in sorted(names.items()))
        lines = [
            f"SQL {self.table}: {verb[0]} {self.expired_rows:,} expired rows and {sum(self.removed_sources.values()):,} rows of "
            f"sources no longer defined" + (f" ({removed})" if removed else ""),
            f"SQL {self.table}: {verb[1]} {self.keys_removed_total:,} JSON keys no longer stored from {self.rows_stripped:,} rows"
            + (f" ({keys})" if keys else ""),
            f"SQL {self.table}: visited {self.rows_visited:,} rows in {self.pages:,} pages in {self.seconds:.1f}s",
        ]
        return lines


def plan_sql_cleanup(conf: RunConf, defs: Definitions, entity_name: str) -> SqlCleanupPlan:
    entity = defs.entity(entity_name)
    stored = {s.name: tuple(f.stored_name for f in s.features) for s in defs.sources_of(entity.name)}
    target = sink_targets(conf.model_copy(update={"sinks": ["sql"]})).get("sql", "")
    return SqlCleanupPlan(entity.name, sql_sink_config(conf, None, entity), stored, target)


# -- the statements: each bounded to one page of the primary key ------------------------------


def _range(first: bool) -> sql.SQL:
    # (after, last]: the page's keys; the first page has no lower bound
    upper = "(entity_key, source) <= (%(last_key)s, %(last_source)s)"
    return sql.SQL(upper if first else "(entity_key, source) > (%(after_key)s, %(after_source)s) AND " + upper)


def page_query(table: sql.Identifier, first: bool) -> sql.Composed:
    """The next page's keys, in primary-key order (parameters: after_*, limit)."""
    after = "" if first else "WHERE (entity_key, source) > (%(after_key)s, %(after_source)s) "
    return sql.SQL("SELECT entity_key, source FROM {table} " + after + "ORDER BY entity_key, source LIMIT %(limit)s").format(table=table)


def removed_sources_statement(table: sql.Identifier, first: bool, dry_run: bool) -> sql.Composed:
    """Rows of sources not defined (parameter: defined, the names); one row per row deleted, its source."""
    head = "SELECT source FROM {table}" if dry_run else "DELETE FROM {table}"
    tail = "" if dry_run else " RETURNING source"
    return sql.SQL(head + " WHERE {range} AND source <> ALL(%(defined)s)" + tail).format(table=table, range=_range(first))


def expired_statement(table: sql.Identifier, first: bool, dry_run: bool) -> sql.Composed:
    """Rows past their expiry (of the defined sources: the others went with their source)."""
    head = "SELECT count(*) FROM {table}" if dry_run else "DELETE FROM {table}"
    return sql.SQL(head + " WHERE {range} AND source = ANY(%(defined)s) AND expires_at <= now()").format(table=table, range=_range(first))


def stale_keys_statement(table: sql.Identifier, first: bool, dry_run: bool) -> sql.Composed:
    """Rows of one source, not expired, holding keys it no longer stores (parameters: source,
    stored), with those keys and their values (only they cross the wire); locked until the
    page commits."""
    lock = "" if dry_run else " FOR UPDATE"
    return sql.SQL(
        "SELECT entity_key, (features - %(stored)s::TEXT[])::TEXT FROM {table} WHERE {range} AND source = %(source)s "
        "AND (expires_at IS NULL OR expires_at > now()) AND features - %(stored)s::TEXT[] <> '{{}}'::JSONB" + lock
    ).format(table=table, range=_range(first))


def strip_statement(table: sql.Identifier, first: bool) -> sql.Composed:
    """Remove these keys from these rows of one source (parameters: stale, source, keys)."""
    return sql.SQL(
        "UPDATE {table} SET features = features - %(stale)s::TEXT[] WHERE {range} AND source = %(source)s AND entity_key = ANY(%(keys)s)"
    ).format(table=table, range=_range(first))


# -- the walk ----------------------------------------------------------------------------------


def check_cleanup_role(conn: psycopg.Connection, conf: SqlSinkConfig, dry_run: bool) -> bool:
    """Whether the table is there; refuses a table without ``expires_at`` or a role lacking
    what cleanup needs, before anything is changed."""
    columns = table_columns(conn, conf)
    if not columns:
        return False
    if "expires_at" not in columns:
        raise SqlCleanupError(
            f"table {conf.table_name} has no column expires_at (made before the entity TTL reached SQL rows): "
            "run the schema step, `materialize schema --env <env>`, under the role that owns it"
        )
    wanted = ("SELECT",) if dry_run else ("SELECT", "UPDATE", "DELETE")
    row = conn.execute(
        "SELECT " + ", ".join(f"has_table_privilege(c.oid, '{p}')" for p in wanted) + " "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = %s AND n.nspname = COALESCE(%s, current_schema())",
        (conf.table, conf.schema),
    ).fetchone()
    lacking = [p for p, ok in zip(wanted, row or [True] * len(wanted)) if not ok]
    if lacking:
        raise SqlCleanupError(
            f"table {conf.table_name}: this role lacks {', '.join(lacking)} on it, which cleanup needs: run cleanup as a role "
            f"granted SELECT, UPDATE, DELETE ({CLEANUP_ROLE} in conf/base/sql-grants.sql), with --sql-dsn and --sql-password-env"
        )
    return True


def _clean_page(conn: psycopg.Connection, plan: SqlCleanupPlan, bounds: dict, first: bool, dry_run: bool) -> _Page:
    table, page = plan.config.table_id, _Page()
    defined = sorted(plan.stored)
    with conn.transaction():
        rows = conn.execute(removed_sources_statement(table, first, dry_run), {**bounds, "defined": defined}).fetchall()
        page.removed.update(source for (source,) in rows)
        if dry_run:
            page.expired = conn.execute(expired_statement(table, first, True), {**bounds, "defined": defined}).fetchone()[0]
        else:
            page.expired = conn.execute(expired_statement(table, first, False), {**bounds, "defined": defined}).rowcount
        for source, stored in sorted(plan.stored.items()):
            params = {**bounds, "source": source, "stored": list(stored)}
            by_stale: dict[tuple[str, ...], list[str]] = defaultdict(list)
            for key, text in conn.execute(stale_keys_statement(table, first, dry_run), params):
                by_stale[tuple(sorted(json.loads(text)))].append(key)
            for stale, keys in by_stale.items():
                page.keys[source].update({name: len(keys) for name in stale})
                page.stripped += len(keys)
                if not dry_run:
                    conn.execute(strip_statement(table, first), {**bounds, "stale": list(stale), "source": source, "keys": keys})
    return page


def clean_sql(conf: RunConf, plan: SqlCleanupPlan, *, dry_run: bool = False) -> SqlCleanupResult:
    """Walk the table page by page; an error stops the walk, keeping (and reporting) what was done."""
    settings, config = conf.sql, plan.config
    result = SqlCleanupResult(config.table_name, dry_run=dry_run)
    page_rows = settings.batch_rows * settings.statements_per_transaction
    held: list[psycopg.Connection] = []

    def connection() -> psycopg.Connection:
        if held and (held[0].closed or held[0].broken):
            held.pop().close()
        if not held:
            held.append(connect(config))
        return held[0]

    def step(after: tuple[str, str] | None) -> tuple[list, _Page]:
        """One page: its keys, then what was done to it in one transaction (repeated whole after a transient error)."""
        conn, first = connection(), after is None
        since = {} if first else {"after_key": after[0], "after_source": after[1]}
        keys = conn.execute(page_query(config.table_id, first), {"limit": page_rows, **since}).fetchall()
        if not keys:
            return keys, _Page()
        bounds = {"last_key": keys[-1][0], "last_source": keys[-1][1], **since}
        return keys, _clean_page(conn, plan, bounds, first, dry_run)

    def retried(fn):
        delays = {"base_delay": settings.retry_base_delay, "max_delay": settings.retry_max_delay}
        return call_with_retries(fn, is_transient=is_transient, retries=settings.retries, **delays)

    start = time.perf_counter()
    try:
        if retried(lambda: check_cleanup_role(connection(), config, dry_run)):
            after: tuple[str, str] | None = None
            while True:
                keys, page = retried(partial(step, after))
                if not keys:
                    break
                result.add(page, len(keys))
                after = keys[-1]
                if len(keys) < page_rows:
                    break
    except (psycopg.Error, MaterializerError) as exc:
        result.error = exc
    finally:
        for conn in held:
            conn.close()
    result.seconds = time.perf_counter() - start
    return result
