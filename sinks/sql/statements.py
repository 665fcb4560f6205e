"""The SQL the sink sends, per dialect, composed with ``psycopg.sql`` (identifiers quoted).

CockroachDB and PostgreSQL share the wire protocol and most SQL; the differences that
matter here are the column type names, pre-splitting (``SPLIT AT``) and row-level TTL
(CockroachDB only: its TTL job deletes the rows past ``expires_at``; on PostgreSQL
``materialize cleanup`` does). The upsert is the same on both: CockroachDB's blind
``UPSERT INTO`` would replace a newer snapshot with an older one, so both take
``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE``.

Expiry (serializers/FORMAT.md, "SQL layout"): ``expires_at`` is the server's ``now()`` at
the write plus the entity type's TTL and the entity's jitter, the seconds its Redis key gets
(NULL: no TTL, never expires). As in Redis, where the TTL is the hash's and so the entity's,
a write moves the expiry of the entity's rows of other sources too, and a row past its
expiry is gone: no reader serves it, and the next write replaces it whatever its as-of.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Literal

from psycopg import sql

from stores.sql import table_identifier  # noqa: F401  (the statements' callers name tables with it)

Dialect = Literal["postgres", "cockroach"]
DIALECTS: tuple[str, ...] = ("postgres", "cockroach")
COLUMNS = ("entity_key", "source", "features", "as_of", "expires_at")
ALIVE = "(expires_at IS NULL OR expires_at > now())"
"""A row not past its expiry (the readers' filter, feature_reader/sql_reads.py, says the same)."""
TTL_JOB_CRON = "@daily"
"""CockroachDB: how often its TTL job deletes expired rows (readers never serve them meanwhile)."""


def dialect_from_version(version: str) -> Dialect:
    """``SELECT version()`` says "CockroachDB CCL v24.1..." on CockroachDB."""
    return "cockroach" if "cockroachdb" in version.lower() else "postgres"


def create_table(table: sql.Identifier, dialect: Dialect) -> sql.Composed:
    text = "STRING" if dialect == "cockroach" else "TEXT"
    return sql.SQL(
        "CREATE TABLE IF NOT EXISTS {table} ("
        "entity_key {text} NOT NULL, "
        "source {text} NOT NULL, "
        "features JSONB NOT NULL, "
        "as_of TIMESTAMPTZ NOT NULL, "
        "expires_at TIMESTAMPTZ, "
        "PRIMARY KEY (entity_key, source)){ttl}"
    ).format(table=table, text=sql.SQL(text), ttl=sql.SQL(" WITH ({})").format(_ttl_params()) if dialect == "cockroach" else sql.SQL(""))


def _ttl_params() -> sql.Composed:
    return sql.SQL("ttl_expiration_expression = {}, ttl_job_cron = {}").format(sql.Literal("expires_at"), sql.Literal(TTL_JOB_CRON))


def set_row_ttl(table: sql.Identifier) -> sql.Composed:
    """CockroachDB: let its TTL job delete the rows past ``expires_at`` (a NULL never expires)."""
    return sql.SQL("ALTER TABLE {table} SET ({params})").format(table=table, params=_ttl_params())


def add_expiry_column(table: sql.Identifier, ttl_seconds: int | None) -> list[sql.Composed]:
    """A table made before ``expires_at``: the column, its existing rows expiring one TTL from
    now (never before their Redis keys, whose expiry counts from a write already made), and no
    default kept (every write sets it). PostgreSQL evaluates the default once and stores it
    in the catalog: no table rewrite."""
    column = sql.SQL("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS expires_at TIMESTAMPTZ").format(table=table)
    if not ttl_seconds:
        return [column]
    default = sql.SQL(" DEFAULT now() + {} * INTERVAL '1 second'").format(sql.Literal(ttl_seconds))
    return [column + default, sql.SQL("ALTER TABLE {table} ALTER COLUMN expires_at DROP DEFAULT").format(table=table)]


def upsert(table: sql.Identifier, rows: int, beyond_horizon: bool = False) -> sql.Composed:
    """A full-row upsert of ``rows`` rows that never replaces a newer snapshot still alive.

    Parameters are (key, source, json, as_of, ttl seconds or None) per row. A row whose
    stored ``as_of`` is later than the new one is left as it is (not returned), unless it is
    past its expiry (gone, as its Redis key would be); an equal one is written again, so a
    rerun repeats itself. Returns the keys written. CockroachDB's ``UPSERT`` cannot carry
    that condition, so both dialects send the same ``INSERT ... ON CONFLICT ... WHERE``,
    which CockroachDB supports.

    ``beyond_horizon``: the same rows, sent again when the first statement left some, with
    one more parameter, the horizon: only stored rows whose ``as_of`` is later than it
    (beyond any date a run accepts: corrupt) are replaced, and it returns their keys.
    Two statements rather than one ``WHERE ... OR stored.as_of > horizon``, so the replaced
    rows are counted apart (RETURNING does not say which condition let a row through) at no cost to the
    usual batch, which leaves none."""
    if rows < 1:
        raise ValueError("an upsert needs at least one row")
    columns = sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
    values = sql.SQL(", ").join([sql.SQL("(%s, %s, %s::JSONB, %s, now() + %s::FLOAT8 * INTERVAL '1 second')")] * rows)
    condition = "stored.as_of > %s" if beyond_horizon else "stored.as_of <= excluded.as_of OR stored.expires_at <= now()"
    return sql.SQL(
        "INSERT INTO {table} AS stored ({columns}) VALUES {values} "
        "ON CONFLICT (entity_key, source) DO UPDATE SET features = excluded.features, as_of = excluded.as_of, "
        "expires_at = excluded.expires_at "
        "WHERE {condition} "
        "RETURNING entity_key"
    ).format(table=table, columns=columns, values=values, condition=sql.SQL(condition))


def follow_expiry(table: sql.Identifier) -> sql.Composed:
    """The rows of other sources of the entities just written take their new expiry (NULL
    included), as the fields of every source in a Redis hash share its TTL; rows already past
    theirs stay gone. Parameters: keys (written), source (that wrote them). Both sides are
    bounded by the keys, so each is a primary-key lookup whatever the table's size."""
    return sql.SQL(
        "UPDATE {table} AS other SET expires_at = mine.expires_at FROM {table} AS mine "
        "WHERE mine.entity_key = ANY(%(keys)s) AND mine.source = %(source)s "
        "AND other.entity_key = ANY(%(keys)s) AND other.source <> %(source)s AND other.entity_key = mine.entity_key "
        "AND (other.expires_at IS NULL OR other.expires_at > now()) "
        "AND other.expires_at IS DISTINCT FROM mine.expires_at"
    ).format(table=table)


def split_at(table: sql.Identifier, keys: Sequence[str], expires: dt.datetime) -> sql.Composed:
    """CockroachDB: split the table's ranges at these entity keys until ``expires``.

    The keys are a prefix of the primary key (entity_key, source), which SPLIT AT accepts.
    The expiration lets CockroachDB merge the ranges again once the load has spread out.
    """
    if not keys:
        raise ValueError("no split keys")
    if expires.tzinfo is None:
        raise ValueError("the split expiration needs a time zone")
    stamp = expires.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S+00:00")
    values = sql.SQL(", ").join(sql.SQL("({})").format(sql.Literal(k)) for k in keys)
    return sql.SQL("ALTER TABLE {table} SPLIT AT VALUES {values} WITH EXPIRATION {expires}").format(
        table=table, values=values, expires=sql.Literal(stamp)
    )


def quantile_keys(sorted_sample: Sequence[str], splits: int) -> list[str]:
    """``splits`` keys cutting a sorted sample into ``splits + 1`` parts of equal size.

    Duplicates are dropped (a split key must be unique); fewer keys come back when the
    sample has fewer distinct values.
    """
    n = len(sorted_sample)
    if splits < 1 or n == 0:
        return []
    keys: list[str] = []
    for i in range(1, splits + 1):
        key = sorted_sample[min(n - 1, (i * n) // (splits + 1))]
        if not keys or key != keys[-1]:
            keys.append(key)
    return keys
