"""What a SQL writer is given: a frozen, picklable config built from the run
configuration, the entity's table and the run's date (:func:`sql_sink_config`).

It is a :class:`fm_config.sql.SqlConnection` (how to reach the store; the password is not
carried, only where it is) with what a write needs on top.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, fields

from psycopg import sql

from feature_defs import EntityDef, SourceDef
from fm_config import RunConf
from fm_config.sql import SqlConnection
from serializers.horizon import as_of_horizon
from serializers.keys import as_of_epoch, key_prefix
from sinks.sql import statements as stmts
from sinks.sql.statements import Dialect


@dataclass(frozen=True, kw_only=True)
class SqlSinkConfig(SqlConnection):
    table: str
    source: str
    as_of: int
    """Snapshot as-of time, UTC epoch seconds."""
    horizon: int = field(default_factory=as_of_horizon)
    """A stored as_of later than this is beyond any date a run accepts: corrupt, and
    replaced (serializers/horizon.py). From the driver's clock when the config is made."""
    dialect: Dialect
    ttl_seconds: int | None = None
    """The entity type's TTL: each row written expires this long (plus jitter) after the write."""
    ttl_jitter: float = 0.1
    key_prefix: str = ""
    """The entity type's Redis key prefix: a row's jitter is its Redis key's (serializers.keys.ttl_with_jitter)."""
    follow_expiry: bool = True
    """Move the expiry of the written entities' rows of other sources to theirs (False: the
    entity type has no other source, and the UPDATE that would find nothing is not sent)."""
    batch_rows: int = 25
    """Rows per upsert statement."""
    statements_per_transaction: int = 20
    """Statements pipelined in one transaction (1: each statement commits on its own)."""
    retries: int = 5
    """Further attempts of a transaction after a transient error."""
    retry_base_delay: float = 0.2
    retry_max_delay: float = 5.0

    @property
    def table_id(self) -> sql.Identifier:
        return stmts.table_identifier(self.table, self.schema)

    @property
    def table_name(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table


def sql_sink_config(
    conf: RunConf,
    source: SourceDef | None = None,
    entity: EntityDef | None = None,
    date: dt.date | None = None,
    dialect: Dialect = "postgres",
    connection: SqlConnection | None = None,
) -> SqlSinkConfig:
    """The writer's config for one source and date (dialect: as detected by the preflight;
    ``connection``: other credentials than the run's, the server's pushes)."""
    settings = conf.sql
    connection = connection or conf.sql_connection()
    return SqlSinkConfig(
        **{f.name: getattr(connection, f.name) for f in fields(SqlConnection)},
        table=entity.sql_table if entity else "",
        source=source.name if source else "",
        as_of=as_of_epoch(date) if date else 0,
        dialect=dialect,
        ttl_seconds=entity.ttl_seconds if entity else None,
        ttl_jitter=conf.redis.ttl_jitter,
        key_prefix=key_prefix(entity.prefix, conf.redis.namespace) if entity else "",
        batch_rows=settings.batch_rows,
        statements_per_transaction=settings.statements_per_transaction,
        retries=settings.retries,
        retry_base_delay=settings.retry_base_delay,
        retry_max_delay=settings.retry_max_delay,
    )
