"""The schema step (`materialize schema`): create, or check, the SQL store's entity tables.

The nightly writer needs no DDL rights: it checks its table and writes rows
(conf/base/sql-grants.sql). Creating a table is this step's job, run when an entity type
is added, under a role that may create tables, and so is bringing a table made before the
``expires_at`` column up to the layout (and CockroachDB's row-level TTL: its owner's); ``--sql-dsn`` and ``--sql-password-env``
give it credentials other than the writer's.
"""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from feature_defs import Definitions, SourceDef
from fm_config import RunConf
from sinks.errors import TerminalSinkError
from sinks.sql.config import sql_sink_config
from sinks.sql.preflight import dialect_of, ensure_schema
from stores.sql import connect


def table_sources(defs: Definitions, source_names: Sequence[str]) -> dict[str, SourceDef]:
    """One source per entity table the named sources write (the table is per entity type)."""
    out: dict[str, SourceDef] = {}
    for name in source_names:
        source = defs.source(name)
        out.setdefault(defs.entity_of(source).sql_table, source)
    return out


def ensure_tables(conf: RunConf, defs: Definitions, source_names: Sequence[str]) -> dict[str, str]:
    """Create the missing entity tables, bring older ones up to the layout and check every
    table's columns: table -> 'created', 'exists', or 'exists; ' and what was changed."""
    sources = table_sources(defs, source_names)
    if not sources:
        return {}
    try:
        conn = connect(sql_sink_config(conf))  # DSN, credentials and timeouts
    except psycopg.Error as exc:
        raise TerminalSinkError(f"cannot connect to the SQL store ({conf.sql.dsn}): {str(exc).strip()}") from exc
    done: dict[str, str] = {}
    with conn:
        dialect = dialect_of(conf.sql, conn)
        for source in sources.values():
            sink_conf = sql_sink_config(conf, source, defs.entity_of(source), dialect=dialect)
            notes: list[str] = []
            created = ensure_schema(conn, sink_conf, notes)
            done[sink_conf.table_name] = "; ".join(["created" if created else "exists", *notes])
    return done
