"""What a write of a source records in each store's description of what it holds
(serializers/description.py), checked against what the store says first: a stored name
held as something the definitions would read differently refuses the write, with nothing
written to either store. The run (jobs/pipeline/describe.py) and the server's pushes
(feature_push) call it alike."""

from __future__ import annotations

from feature_defs import SourceDef
from feature_defs.loader import DefinitionError
from feature_defs.stored_lock import next_stored_name
from fm_config import RunConf
from serializers.description import Description, conflicts, updated
from sinks.redis.config import RedisSinkConfig
from sinks.redis.description import read_description
from sinks.sql.config import SqlSinkConfig
from sinks.sql.description import read_descriptions
from stores.sql import connect as sql_connect

STORE_NAMES = {"redis": "Redis", "sql": "the SQL store"}


def described_writes(
    conf: RunConf, source: SourceDef, redis_sink: RedisSinkConfig | None, sql_sink: SqlSinkConfig | None
) -> dict[str, Description]:
    """Per store given: the entries a write of ``source`` records there; DefinitionError
    (one line per feature) when a store holds one of its stored names as something else."""
    encodings = {f.stored_name: f.encoding for f in source.features}
    found: dict[str, Description] = {}
    if redis_sink is not None:
        mode = conf.redis.mode
        found["redis"] = read_description(redis_sink, cluster=None if mode == "auto" else mode == "cluster")
    if sql_sink is not None:
        with sql_connect(sql_sink) as conn:
            found["sql"] = read_descriptions(conn, sql_sink.schema, [sql_sink.table]).get(sql_sink.table, {})
    by_name = {f.stored_name: f for f in source.features}
    taken = set(encodings).union(*found.values())  # one fresh name per feature, free in every store
    problems = []
    for store, held in found.items():
        for name, why in sorted(conflicts(held, source.name, encodings).items()):
            problems.append(
                f"source {source.name!r}: feature {by_name[name].name!r}: {STORE_NAMES[store]} says its stored name {name!r} is "
                f"{why}: give it fresh storage with `stored_as: {next_stored_name(name, taken)}`, or change it back"
            )
    if problems:
        raise DefinitionError(problems)  # before either store is written
    return {store: updated(held, source.name, encodings) for store, held in found.items()}
