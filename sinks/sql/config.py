"""What a SQL writer is given: a frozen, picklable config built from the ``sql:`` settings,
the entity's table and the run's date (:func:`sink_config`).

The password is not carried here: ``secret`` names where it is (env var or mounted file),
and each executor reads it there when it connects (``auth_password()``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from psycopg import sql

from feature_defs import EntityDef, SourceDef
from serializers.keys import as_of_epoch
from sinks.settings import SecretRef
from sinks.sql import statements as stmts
from sinks.sql.settings import SqlSettings
from sinks.sql.statements import Dialect


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
    """A literal password (programs that build a config themselves); the conf's is ``secret``."""
    secret: SecretRef | None = None
    """Where the password is (env var or mounted file), read where the connection is made."""

    def auth_password(self) -> str | None:
        """The password to connect with: the literal one, else the secret's, read here (an
        executor reads its own environment or mounted file)."""
        return self.password if self.password is not None else self.secret.value() if self.secret else None

    @property
    def table_id(self) -> sql.Identifier:
        return stmts.table_identifier(self.table, self.schema)

    @property
    def table_name(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table


def sink_config(
    settings: SqlSettings, source: SourceDef | None, entity: EntityDef | None, date: dt.date | None, dialect: Dialect = "postgres", *, secret: SecretRef | None
) -> SqlSinkConfig:
    """The writer's config for one source and date (dialect: as detected by the preflight)."""
    return SqlSinkConfig(
        dsn=settings.dsn,
        table=entity.sql_table if entity else "",
        schema=settings.db_schema,
        source=source.name if source else "",
        as_of=as_of_epoch(date) if date else 0,
        dialect=dialect,
        batch_rows=settings.batch_rows,
        statements_per_transaction=settings.statements_per_transaction,
        statement_timeout_ms=settings.statement_timeout_ms,
        connect_timeout=settings.connect_timeout,
        retries=settings.retries,
        retry_base_delay=settings.retry_base_delay,
        retry_max_delay=settings.retry_max_delay,
        secret=secret,
    )
