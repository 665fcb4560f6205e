"""The SQL description of what the entity tables hold (serializers/description.py): the
table ``stored_names`` beside them, created with them, read before a run writes and
recorded right before its rows."""

from __future__ import annotations

import psycopg
from psycopg import sql

from serializers.description import CREATE_TABLE, SELECT, SQL_TABLE, UPSERT, Description, from_sql, sql_rows
from sinks.sql import statements as stmts
from sinks.sql.statements import Dialect


def description_table(schema: str | None) -> sql.Identifier:
    return stmts.table_identifier(SQL_TABLE, schema)


def create_description_table(schema: str | None, dialect: Dialect) -> sql.Composed:
    return sql.SQL(CREATE_TABLE[dialect]).format(description_table(schema))


def read_descriptions(conn: psycopg.Connection, schema: str | None, tables: list[str]) -> dict[str, Description]:
    """Entity table -> its description (a table without one is left out)."""
    rows = conn.execute(sql.SQL(SELECT).format(description_table(schema)), (tables,)).fetchall()
    return from_sql(rows)


def record_description(conn: psycopg.Connection, schema: str | None, table: str, entries: Description) -> None:
    """Upsert ``entries`` of entity table ``table`` (each row on its own: the entries are independent)."""
    if entries:
        conn.cursor().executemany(sql.SQL(UPSERT).format(description_table(schema)), sql_rows(table, entries))
