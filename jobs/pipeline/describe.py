"""Before any store is written: what each store says it holds (serializers/description.py)
against the source's definitions. A stored name the store holds as something the
definitions would read differently (another encoding, another source's values, a retired
name) refuses the run, with nothing written to either store; otherwise the entries the
run records in each store, right before its values (write_redis, write_sql)."""

from __future__ import annotations

from jobs.pipeline.context import RunContext
from serializers.description import Description
from sinks.described import described_writes
from sinks.sql.config import SqlSinkConfig


def check_descriptions(ctx: RunContext, sql_sink: SqlSinkConfig | None) -> dict[str, Description]:
    """Per store to write: the entries this run records there (may be empty)."""
    redis_sink = ctx.redis_config() if "redis" in ctx.conf.sinks else None
    return described_writes(ctx.conf, ctx.source, redis_sink, sql_sink)
