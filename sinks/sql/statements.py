"""The SQL the sink sends, per dialect, composed with ``psycopg.sql`` (identifiers quoted).

CockroachDB and PostgreSQL share the wire protocol and most SQL; the differences that
matter here are the column type names and pre-splitting (``SPLIT AT``, CockroachDB only).
The upsert is the same on both: CockroachDB's blind ``UPSERT INTO`` would replace a newer
snapshot with an older one, so both take ``INSERT ... ON CONFLICT ... DO UPDATE ... WHERE``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Literal

from psycopg import sql

from stores.sql import table_identifier  # noqa: F401  (the statements' callers name tables with it)

Dialect = Literal["postgres", "cockroach"]
DIALECTS: tuple[str, ...] = ("postgres", "cockroach")
COLUMNS = ("entity_key", "source", "features", "as_of")


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
        "PRIMARY KEY (entity_key, source))"
    ).format(table=table, text=sql.SQL(text))


def upsert(table: sql.Identifier, rows: int, beyond_horizon: bool = False) -> sql.Composed:
    """A full-row upsert of ``rows`` rows that never replaces a newer snapshot.

    Parameters are (key, source, json, as_of) per row. A row whose stored ``as_of`` is later
    than the new one is left as it is (the statement's row count leaves it out); an equal
    one is written again, so a rerun repeats itself. CockroachDB's ``UPSERT`` cannot carry
    that condition, so both dialects send the same ``INSERT ... ON CONFLICT ... WHERE``,
    which CockroachDB supports.

    ``beyond_horizon``: the same rows, sent again when the first statement left some, with
    one more parameter, the horizon: only stored rows whose ``as_of`` is later than it
    (beyond any date a run accepts: corrupt) are replaced, and its row count counts them.
    Two statements rather than one ``WHERE ... OR stored.as_of > horizon``, so the replaced
    rows are counted apart (neither dialect's RETURNING sees the old row) at no cost to the
    usual batch, which leaves none."""
    if rows < 1:
        raise ValueError("an upsert needs at least one row")
    columns = sql.SQL(", ").join(map(sql.Identifier, COLUMNS))
    values = sql.SQL(", ").join([sql.SQL("(%s, %s, %s::JSONB, %s)")] * rows)
    condition = "stored.as_of > %s" if beyond_horizon else "stored.as_of <= excluded.as_of"
    return sql.SQL(
        "INSERT INTO {table} AS stored ({columns}) VALUES {values} "
        "ON CONFLICT (entity_key, source) DO UPDATE SET features = excluded.features, as_of = excluded.as_of "
        "WHERE {condition}"
    ).format(table=table, columns=columns, values=values, condition=sql.SQL(condition))


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
