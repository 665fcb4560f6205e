"""What a write of a source records in each store's description of what it holds
(serializers/description.py), checked against what the store says first: a stored name
held as something the definitions would read differently refuses the write, with nothing
written to either store. The run (jobs/pipeline/describe.py) and the server's pushes
(feature_push) call it alike."""

from __future__ import annotations

from feature_defs import SourceDef
from feature_defs.loader import DefinitionError
from feature_defs.stored_lock import Lock, next_stored_name
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
    found: dict[str, Description] = {}
    if redis_sink is not None:
        mode = conf.redis.mode
        found["redis"] = read_description(redis_sink, cluster=None if mode == "auto" else mode == "cluster")
    if sql_sink is not None:
        with sql_connect(sql_sink) as conn:
            found["sql"] = read_descriptions(conn, sql_sink.schema, [sql_sink.table]).get(sql_sink.table, {})
    return checked_entries(source, found)


def checked_entries(source: SourceDef, found: dict[str, Description]) -> dict[str, Description]:
    """Per store: the entries a write of ``source`` records, given what each store describes
    (``found``); DefinitionError when a store holds one of its stored names as something else."""
    encodings = {f.stored_name: f.encoding for f in source.features}
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


def unknown_names(source: SourceDef, found: dict[str, Description], lock: Lock | None) -> dict[str, str]:
    """Stored name -> the store describing it as one of ``source``'s, live, that these
    definitions neither write nor know as removed (their stored.lock records it retired):
    written by newer definitions, which a writer on these must neither re-date nor retire."""
    written = {f.stored_name for f in source.features}
    removed = {n for n, s in (lock.entities.get(source.entity, {}) if lock else {}).items() if s.retired and s.source == source.name}
    out: dict[str, str] = {}
    for store, held in found.items():
        for name, h in sorted(held.items()):
            if h.source == source.name and not h.retired and name not in written and name not in removed:
                out.setdefault(name, STORE_NAMES[store])
    return out
