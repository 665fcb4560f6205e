"""A Feast repository's objects, as feast_dump.py prints them, to this project's definitions:
entity types, one source per feature view (a PushSource the view reads as its ``push_source``),
feature services; and every choice in words.

Names stay Feast's (a view is a source of the same name, a field a feature of the same name),
so a Feast client's references (``driver_hourly_stats:conv_rate``, ``full_feature_names``)
work unchanged. What does not fit is listed with the reason and left out, never renamed.

One rule of this project shapes the mapping beyond the types: an entity type is one Redis key
per entity (one hash holds every source's features, as Feast keeps one key per entity), its
keys the join keys of one or more Feast entities, and a stored name is unique per entity type.
A view whose feature names another view of the same entities already has (Feast's example
defines two such views) goes on the same entity type, those features stored under fresh
stored names (``stored_as: conv_rate@2``), said in the plan.

An earlier output (``Previous``) keeps what must not move: the entity type each source is on,
each entity type's prefix and SQL table, and what an operator added to the files (``stored_as``,
checks, schedules).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import TypeAdapter, ValidationError

from feature_defs.feast_import.errors import FeastImportError
from feature_defs.feast_import.value_types import feature_type, key_type
from feature_defs.models import EntityDef, FeatureDef, FeatureName, FeatureServiceDef, Identifier, KeyColumn, Prefix, SourceDef, TableName
from feature_defs.stored_lock import next_stored_name

# The patterns of feature_defs/models.py, checked before a definition is built, so a name that
# does not fit is left out with its reason instead of failing the whole import.
_PATTERNS = {
    "identifier": TypeAdapter(Identifier),
    "feature": TypeAdapter(FeatureName),
    "table": TypeAdapter(TableName),
    "prefix": TypeAdapter(Prefix),
}

KEPT_FEATURE_KEYS = (
    "stored_as",
    "max_null_fraction",
    "min_value",
    "max_value",
    "allowed_values",
    "severity",
    "max_length",
    "max_bytes",
    "compression",
)
"""What an operator may add to an imported feature, kept by the next import."""
KEPT_SOURCE_KEYS = ("schedule", "lookback_seconds", "on_tie", "expectations", "max_age_seconds")
"""What an operator may add to an imported source, kept by the next import (``max_age_seconds``
only from an output that records ``feast_ttl_seconds``: before it, the import wrote it from Feast's ttl)."""
FILE_SOURCES = ("FileSource", "SparkSource")
STREAMS = ("PushSource", "KafkaSource", "KinesisSource")


def fits(kind: str, name: object) -> bool:
    try:
        _PATTERNS[kind].validate_python(name)
        return isinstance(name, str)
    except ValidationError:
        return False


_RULES = {
    "identifier": "a name here is [A-Za-z_][A-Za-z0-9_]{0,62}",
    "feature": "a feature name here is [a-z][a-z0-9_]{0,127}",
    "table": "a catalog table here is name, db.name or catalog.db.name, each part [A-Za-z_][A-Za-z0-9_]{0,127}",
}


@dataclass(frozen=True)
class Previous:
    """What an earlier import's output holds that the next import keeps (see the module doc)."""

    entities: dict = field(default_factory=dict)
    """entity type name -> its mapping as written (prefix, sql_table, keys, ttl_seconds)."""
    sources: dict = field(default_factory=dict)
    """source name -> its mapping as written (entity, features, schedule, ...)."""
    held: dict = field(default_factory=dict)
    """entity type name -> every stored name its stored.lock holds (retired ones too): never picked afresh."""

    def prefixes(self) -> set[str]:
        return {e["prefix"] for e in self.entities.values() if isinstance(e.get("prefix"), str)}


@dataclass
class Plan:
    """The definitions an import writes, and what it says about them."""

    project: str
    feast_version: str
    entities: list[EntityDef] = field(default_factory=list)
    sources: list[SourceDef] = field(default_factory=list)
    services: list[FeatureServiceDef] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    """Every choice made, one line each: entity types, sources and their features, services."""
    left_out: list[str] = field(default_factory=list)
    """Every Feast object or part not carried over, one line each with the reason."""
    warnings: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    """One line per source path on this machine that does not exist."""


@dataclass
class _Draft:
    """A feature view that maps to a source, before its entity type is chosen."""

    view: dict
    entity_names: tuple[str, ...]
    keys: tuple[KeyColumn, ...]
    key_origin: tuple[str, ...]
    key_columns: tuple[str, ...]
    where: dict
    where_text: str
    timestamp_column: str
    created_column: str | None
    ttl_seconds: int
    """Feast's ttl in whole seconds (0: none, forever)."""
    features: list[FeatureDef]
    feature_lines: list[str]
    notes: list[str]
    push_source: str | None = None
    """The name of the PushSource the view reads (its stream_source), which pushes name."""


@dataclass
class _EntityType:
    name: str
    keys: tuple[KeyColumn, ...]
    entity_names: tuple[str, ...]
    key_origin: tuple[str, ...]
    features: dict[str, str] = field(default_factory=dict)
    """stored name -> the source that has it."""


def resolve_path(repo: Path, uri: str) -> str:
    """A source path as Feast resolves it (FileSource.get_uri_for_file_path): a URI as it is
    (``s3://`` as ``s3a://``, the scheme Spark's S3 connector reads), a relative path under the repository."""
    parts = urlsplit(uri)
    if parts.scheme and parts.netloc:
        return "s3a" + uri[len("s3") :] if parts.scheme == "s3" else uri
    path = Path(uri).expanduser()
    return os.path.normpath(path if path.is_absolute() else repo / path)


def _ttl_text(seconds: float) -> str:
    return str(dt.timedelta(seconds=seconds))


OLD_MAX_AGE = "max_age_seconds of an output without feast_ttl_seconds"
"""Previous.sources' key for the max_age_seconds of an output written before feast_ttl_seconds
existed, when the import wrote it from Feast's ttl: equal to the ttl, it is taken for the
import's and removed; otherwise for the operator's and kept (source_def)."""
EARLIER_TTL = "feast_ttl_seconds of the earlier output"


def _reads_said(source: SourceDef, d: _Draft, dropped: int | None, earlier_ttl: int | None) -> tuple[str, list[str]]:
    """How a reader treats the source's old values, for its line, and the notes that say what the other choice would do."""
    feast_ttl = f"Feast's ttl {_ttl_text(d.ttl_seconds)}" if d.ttl_seconds else "Feast's ttl 0: forever"
    feast_reads = (
        "Feast 0.67's online reads serve a value however old (its ttl bounds historical retrieval and the first incremental window)"
    )
    if source.max_age_seconds:
        withheld = "a reader withholds a value older than max_age_seconds (status OUTSIDE_MAX_AGE)"
        notes = [f"{withheld}, where {feast_reads}; remove it to read as Feast"]
        if earlier_ttl and source.max_age_seconds == earlier_ttl != d.ttl_seconds:
            notes.append(
                f"Feast's ttl changed from {earlier_ttl} to {d.ttl_seconds} seconds since the last import: max_age_seconds stays "
                f"{earlier_ttl}, the former ttl; set it to {d.ttl_seconds} to follow"
            )
        return f"max_age_seconds {source.max_age_seconds} (set in the output, kept; {feast_ttl})", notes
    notes = []
    if d.ttl_seconds:
        notes.append(
            f"read as Feast reads: {feast_reads}; `max_age_seconds: {d.ttl_seconds}` on the source (kept by the next import) "
            "would withhold a value older than its ttl (status OUTSIDE_MAX_AGE)"
        )
    if dropped:
        notes.append(
            f"max_age_seconds {dropped}, which an earlier import wrote from Feast's ttl, is removed: a value older than that is "
            "now served, as Feast serves it; set it again on the source to keep withholding it"
        )
    return f"no max age, as Feast reads ({feast_ttl})", notes


def _inference_why(view: dict) -> str:
    """Why Feast inferred nothing for ``view``, in parentheses (feast_dump.py's words), or ""."""
    if view.get("inference_error"):
        return f" ({view['inference_error']})"
    if view.get("config_error"):
        return f" (Feast could not load feature_store.yaml: {view['config_error']})"
    return ""


def _entity_key_problem(entity: dict | None, name: str, view: dict) -> tuple[str | None, str | None, str]:
    """(key type, origin, problem) of a Feast entity's join key in ``view``."""
    if entity is None:
        return (
            None,
            None,
            f"its entity {name!r} is not defined at the top level of a file of the repository (Feast's apply needs it there too)",
        )
    if not fits("identifier", name):
        return None, None, f"its entity name {name!r} does not fit: {_RULES['identifier']}"
    join_key = entity["join_key"]
    if not fits("identifier", join_key):
        return None, None, f"the join key {join_key!r} of entity {name!r} does not fit: {_RULES['identifier']}"
    value_type, origin = entity.get("value_type", "UNKNOWN"), f"Feast {entity.get('value_type')}"
    if value_type == "UNKNOWN":  # Feast infers it per view, from the view's schema or its source
        column = next((c for c in view.get("entity_columns", []) if c["name"] == join_key), None)
        if column is None:
            why = _inference_why(view)
            return (
                None,
                None,
                (
                    f"the type of the join key {join_key!r} of entity {name!r} is unknown: the Entity gives no value_type and Feast "
                    f"could not infer it from the view's source{why}: give the Entity a value_type"
                ),
            )
        value_type, origin = column["value_type"], f"Feast {column['dtype']}, inferred by Feast from the view's source"
    found = key_type(value_type)
    if found is None:
        why = f"the join key {join_key!r} of entity {name!r} is of type {value_type}: a key here is int (Int32, Int64) or string"
        return None, None, why
    return found, origin, ""


def _view_problem(view: dict) -> str:
    """Why a feature view (not a stream feature view) is not carried over, judged before its
    batch source is read ("" when it may be)."""
    batch = view.get("batch_source")
    if view.get("derived_from"):
        return f"derived from the feature views {', '.join(view['derived_from'])}: Feast computes it"
    if view.get("transformation"):
        return "a transformation (udf) computes it in Feast; a source here is a table that holds the values"
    if not view.get("online", True):
        return "online=False: Feast never materializes it into its online store"
    if not view.get("enabled", True):
        return "enabled=False: Feast does not materialize it"
    if not fits("identifier", view["name"]):
        return f"the name does not fit: {_RULES['identifier']}"
    if not view.get("entities"):
        return "it has no entity (Feast keys it by a placeholder); a source here needs an entity with a key"
    if batch is None:
        return "it has no batch source to load from"
    if batch["class"] not in FILE_SOURCES:
        return (
            f"its batch source {batch['name']} is a {batch['class']}, which no Spark reader here reads (the job reads Parquet, "
            "Delta and Spark catalog tables): export it to one of those and point a FileSource or SparkSource at it"
        )
    return ""


def _view_push_source(batch: dict, stream: dict | None, notes: list[str]) -> str | None:
    """The PushSource the view reads (its stream source), if it is one whose name fits; a note
    on what pushes and runs load, or on a stream source that is not carried over."""
    if stream is not None and stream["class"] == "PushSource" and fits("identifier", stream["name"]):
        notes.append(
            f"pushes to its PushSource {stream['name']} write it (push_source, taken by `materialize serve` with server.push); "
            f"runs load its batch source {batch['name']}, which is what `feast materialize` loads for it"
        )
        return stream["name"]
    if stream is not None:
        notes.append(
            f"its {stream['class']} {stream['name']} is not carried over: imported from its batch source {batch['name']}, "
            "which is what `feast materialize` loads for it"
        )
    return None


def _time_columns(view: dict, batch: dict, reverse: dict, notes: list[str]) -> tuple[str, str | None] | str:
    """(event time column, created column or None) in the source's own column names (Feast's
    field_mapping undone), or why the view cannot be read by event time."""
    timestamp = batch.get("timestamp_field") or ""
    if not timestamp:
        why = _inference_why(view)
        return f"its batch source {batch['name']} has no timestamp_field and Feast could not infer one{why}"
    timestamp = reverse.get(timestamp, timestamp)
    created = batch.get("created_timestamp_column") or None
    created = reverse.get(created, created) if created else None
    for label, column in (("timestamp_field", timestamp), ("created_timestamp_column", created)):
        if column is not None and not fits("identifier", column):
            return f"its {label} column {column!r} does not fit: {_RULES['identifier']}"
    if batch.get("date_partition_column"):
        notes.append(
            f"date_partition_column {batch['date_partition_column']} not used: Feast prunes partitions by it, "
            "a run here selects rows by event time"
        )
    return timestamp, created


class _Mapper:
    def __init__(self, dump: dict, repo: Path, project: str, previous: Previous, key_ttl_seconds: int | None):
        self.dump, self.repo, self.previous = dump, repo, previous
        self.key_ttl_seconds = key_ttl_seconds
        self.plan = Plan(project=project, feast_version=str(dump.get("feast_version", "unknown")))
        self.entities = {e["name"]: e for e in dump.get("entities", [])}

    def left_out(self, what: str, why: str) -> None:
        self.plan.left_out.append(f"{what}: {why}")

    # --- feature views -> drafts ------------------------------------------------------------
    def draft(self, view: dict) -> _Draft | None:
        name, what = view["name"], f"feature view {view['name']}"
        if view.get("class") == "StreamFeatureView":
            return self.left_out(
                f"stream feature view {name}", "Feast computes it from a stream with its transformation; the job reads tables"
            )
        problem = _view_problem(view)
        if problem:
            return self.left_out(what, problem)
        batch = view["batch_source"]
        notes: list[str] = []
        push_source = _view_push_source(batch, view.get("stream_source"), notes)
        where = self._where(view, batch, notes)
        if isinstance(where, str):
            return self.left_out(what, where)
        where, where_text = where
        reverse = {feature: column for column, feature in batch.get("field_mapping", {}).items()}
        times = _time_columns(view, batch, reverse, notes)
        if isinstance(times, str):
            return self.left_out(what, times)
        timestamp, created = times
        keyed = self._key_columns(view, reverse)
        if isinstance(keyed, str):
            return self.left_out(what, keyed)
        keys, origins, columns = keyed

        if not view.get("features"):
            why = _inference_why(view)
            return self.left_out(what, f"it declares no schema and Feast could not infer its features from the source{why}")
        features, lines = self._features(view, reverse)
        if not features:
            return self.left_out(what, "none of its features can be carried over (each is listed)")
        ttl = view.get("ttl_seconds") or 0
        return _Draft(
            view=view,
            entity_names=tuple(sorted(view["entities"])),
            keys=tuple(keys),
            key_origin=tuple(origins),
            key_columns=tuple(columns),
            where=where,
            where_text=where_text,
            timestamp_column=timestamp,
            created_column=created,
            ttl_seconds=math.ceil(ttl) if ttl > 0 else 0,
            features=features,
            feature_lines=lines,
            notes=notes,
            push_source=push_source,
        )

    def _key_columns(self, view: dict, reverse: dict) -> tuple[list[KeyColumn], list[str], list[str]] | str:
        """(the key columns, where each key's type comes from, each key's source column) of the
        view's entities, in name order; or why they cannot key a source here."""
        keys, origins, columns = [], [], []
        for entity_name in sorted(view["entities"]):
            entity = self.entities.get(entity_name)
            found, origin, problem = _entity_key_problem(entity, entity_name, view)
            if problem:
                return problem
            join_key = entity["join_key"]
            column = reverse.get(join_key, join_key)
            if not fits("identifier", column):
                return f"the source column {column!r} of join key {join_key!r} does not fit: {_RULES['identifier']}"
            keys.append(KeyColumn(name=join_key, type=found))
            origins.append(origin)
            columns.append(column)
        if len({k.name for k in keys}) < len(keys):
            return "two of its entities share a join key"
        return keys, origins, columns

    def _where(self, view: dict, batch: dict, notes: list[str]) -> tuple[dict, str] | str:
        """({location, format} or {table}, how it reads in words), or why it cannot be read."""
        if batch["class"] == "SparkSource":
            if batch.get("table"):
                if not fits("table", batch["table"]):
                    return f"its SparkSource table {batch['table']!r} does not fit: {_RULES['table']}"
                return {"table": batch["table"]}, f"Spark catalog table {batch['table']} (SparkSource table)"
            if batch.get("query"):
                return (
                    f"its SparkSource {batch['name']} reads a query; the job reads tables and paths: make the query a catalog table or view"
                )
            formats = {"parquet": "parquet", "delta": "delta"}
            table_format = batch.get("table_format")
            if table_format:
                fmt = formats.get(str(table_format).lower())
                if fmt is None:
                    return f"its SparkSource {batch['name']} is a {table_format} table; the job reads Parquet and Delta"
            else:
                fmt = formats.get(str(batch.get("file_format") or "").lower())
                if fmt is None:
                    return f"its SparkSource {batch['name']} reads {batch.get('file_format')!r} files; the job reads Parquet and Delta"
            path = batch.get("path")
        else:
            fmt = {None: "parquet", "parquet": "parquet", "delta": "delta"}.get(batch.get("file_format"))
            if fmt is None:
                return f"its FileSource {batch['name']} has the file format {batch.get('file_format')!r}; the job reads Parquet and Delta"
            path = batch.get("path")
            if batch.get("s3_endpoint_override"):
                notes.append(
                    "its s3_endpoint_override is not carried over: Spark takes the endpoint from spark.extra "
                    "(spark.hadoop.fs.s3a.endpoint, conf/README.md)"
                )
        if not path:
            return f"its {batch['class']} {batch['name']} names no path"
        location = resolve_path(self.repo, path)
        if "://" not in location and not os.path.exists(location):
            self.plan.missing.append(
                f"feature view {view['name']}: source path {location} does not exist ({batch['class']} {batch['name']})"
            )
        said = f"{fmt} at {location}" + (f" ({batch['class']} path {path})" if location != path else "")
        return {"location": location, "format": fmt}, said

    def _features(self, view: dict, reverse: dict) -> tuple[list[FeatureDef], list[str]]:
        kept = self.previous.sources.get(view["name"], {}).get("features", {})
        features, lines = [], []
        for f in view.get("features", []):
            ref = f"{view['name']}:{f['name']}"
            if not fits("feature", f["name"]):
                self.left_out(
                    f"feature {ref}", f"the name does not fit: {_RULES['feature']} (not renamed: Feast's references must keep working)"
                )
                continue
            choice = feature_type(f["value_type"], f.get("vector_length", 0) or 0)
            if choice.type is None:
                self.left_out(f"feature {ref} ({f['dtype']})", choice.why)
                continue
            column = reverse.get(f["name"], f["name"])
            if not fits("identifier", column):
                self.left_out(f"feature {ref}", f"its source column {column!r} does not fit: {_RULES['identifier']}")
                continue
            spec = {"name": f["name"], "type": choice.type, **choice.options}
            if column != f["name"]:
                spec["column"] = column
            if f.get("description"):
                spec["description"] = f["description"]
            feature = self._with_kept(spec, kept.get(f["name"], {}), ref)
            features.append(feature)
            via = f" (column {column}, Feast's field_mapping)" if column != f["name"] else ""
            lines.append(f"  {ref}: {f['dtype']} -> {choice.why}{via}")
        return features, lines

    def _with_kept(self, spec: dict, kept: dict, ref: str) -> FeatureDef:
        """The feature with what the earlier output added to it; an option that no longer fits
        its new type is dropped, and said (``stored_as`` always stays)."""
        extra = {k: kept[k] for k in KEPT_FEATURE_KEYS if k in kept}
        try:
            return FeatureDef(**{**spec, **extra})
        except ValidationError:
            stays = {k: v for k, v in extra.items() if k == "stored_as"}
            dropped = sorted(set(extra) - set(stays))
            if dropped:
                self.plan.warnings.append(
                    f"feature {ref}: {', '.join(dropped)} from the earlier output no longer fit type {spec['type']}: dropped"
                )
            try:
                return FeatureDef(**{**spec, **stays})
            except ValidationError as exc:  # a stored_as edited by hand that is no stored name
                problem = exc.errors()[0]["msg"]
                raise FeastImportError(
                    [f"feature {ref}: stored_as {stays.get('stored_as')!r} in the earlier output: {problem}: fix it in the view's file"]
                ) from None

    # --- entity types ------------------------------------------------------------------------
    def assign(self, drafts: dict[str, _Draft]) -> dict[str, tuple[_Draft, _EntityType, str]]:
        """Each draft's entity type: the one it had in the earlier output, else the type of its
        entities; with why, when it is not its entities' type. Its features whose stored names
        are taken there by a source placed before it get fresh ones (see the module doc)."""
        types: dict[str, _EntityType] = {}
        placed: dict[str, tuple[_Draft, _EntityType, str]] = {}

        def problem(d: _Draft, candidate: str) -> str:
            """Why ``d`` cannot go on entity type ``candidate`` ("" when it can)."""
            if not fits("identifier", candidate):
                return f"entity type name {candidate!r} does not fit: {_RULES['identifier']}"
            et = types.get(candidate)
            if et is None:
                return ""
            if et.keys != d.keys:
                return f"its keys differ from those of entity type {candidate} ({_keys_text(et.keys)})"
            return ""

        for name in sorted(drafts, key=lambda n: (n not in self.previous.sources, n)):  # earlier assignments first
            d = drafts[name]
            base = "_".join(d.entity_names)
            why, chosen = "", None
            for candidate in (base, f"{base}__{name}"):  # the choice a first import makes, and why
                found = problem(d, candidate)
                if not found:
                    chosen = candidate
                    break
                why = why or found
            kept = self.previous.sources.get(name, {}).get("entity")
            if kept and kept != chosen and not problem(d, kept):
                chosen, why = kept, "as in the earlier output"
            if chosen is None:
                self.left_out(f"feature view {name}", why)
                continue
            et = types.setdefault(chosen, _EntityType(chosen, d.keys, d.entity_names, d.key_origin))
            self._fresh_stored_names(d, et, self.previous.held.get(chosen, set()))
            et.features.update(dict.fromkeys((f.stored_name for f in d.features), name))
            placed[name] = (d, et, "" if chosen == base else why)
        return placed

    @staticmethod
    def _fresh_stored_names(d: _Draft, et: _EntityType, held: set[str]) -> None:
        """Fresh stored names for ``d``'s features whose stored names another source of ``et``
        has (the same feature name in two views of one entity), past every name the lock holds
        (``held``), said under each feature's line."""
        taken = set(et.features) | {f.stored_name for f in d.features} | held
        for i, f in enumerate(d.features):
            if f.stored_name in et.features:
                fresh = next_stored_name(f.stored_name, taken)
                taken.add(fresh)
                d.features[i] = f = f.model_copy(update={"stored_as": fresh})
            owner = et.features.get(f.name)
            if owner is None or f.stored_name == f.name:
                continue
            ref = f"{d.view['name']}:{f.name}"  # said on every import, the stored_as kept from the earlier output too
            line = f"  {ref}: stored as {f.stored_name}: {f.name!r} is source {owner}'s, in the same hash per entity (stored_as)"
            at = [j for j, text in enumerate(d.feature_lines) if text.startswith(f"  {ref}: ")]
            d.feature_lines.insert(at[0] + 1 if at else len(d.feature_lines), line)

    def entity_defs(self, used: dict[str, _EntityType]) -> list[EntityDef]:
        """The entity types the sources use, each with its line (before the sources' lines)."""
        lines = []
        taken = set(self.previous.prefixes())
        prefixes = {}
        for name in sorted(used):  # kept prefixes first, then new ones in name order
            kept = self.previous.entities.get(name, {}).get("prefix")
            if isinstance(kept, str) and fits("prefix", kept):
                prefixes[name] = kept
        taken |= set(prefixes.values())
        for name in sorted(used):
            if name not in prefixes:
                prefixes[name] = derive_prefix(name, taken)
                taken.add(prefixes[name])
        out = []
        for name in sorted(used):
            et = used[name]
            before = self.previous.entities.get(name, {})
            sql_table = before.get("sql_table") if fits("identifier", before.get("sql_table")) else sql_table_name(name)
            ttl = self.key_ttl_seconds if self.key_ttl_seconds else before.get("ttl_seconds")
            feast = [self.entities[n] for n in et.entity_names]
            if len(feast) == 1:
                description = feast[0].get("description") or f"Feast entity {feast[0]['name']}"
                if name != feast[0]["name"]:
                    description += f", for {', '.join(sorted(set(et.features.values())))}"
            else:
                description = f"Feast entities {', '.join(et.entity_names)}, together"
            entity = EntityDef(
                name=name,
                prefix=prefixes[name],
                keys=list(et.keys),
                ttl_seconds=ttl if isinstance(ttl, int) and ttl > 0 else None,
                sql_table=sql_table,
                description=description,
            )
            out.append(entity)
            origin = "; ".join(f"{k.name}: {o}" for k, o in zip(et.keys, et.key_origin))
            if len(feast) > 1:
                what = f"entity type {name}: keys {_keys_text(et.keys)}, the join keys of Feast's entities {', '.join(et.entity_names)} "
            elif name != et.entity_names[0]:
                users = ", ".join(sorted(set(et.features.values())))
                what = f"entity type {name}: key {_keys_text(et.keys)}, Feast's entity {et.entity_names[0]}, for {users} alone "
            else:
                what = f"entity {name}: key {_keys_text(et.keys)} "
            what += f"({origin})"
            ttl_text = f", ttl_seconds {entity.ttl_seconds} (Feast's Redis key_ttl_seconds)" if self.key_ttl_seconds else ""
            lines.append(f"{what}, prefix {prefixes[name]}, sql_table {sql_table}{ttl_text}")
            if before.get("keys") not in (None, [k.model_dump() for k in et.keys]):
                self.plan.warnings.append(
                    f"entity type {name}: its keys changed from the earlier output's: the keys already written under prefix "
                    f"{prefixes[name]} stay until their TTL or `materialize cleanup`"
                )
        for name in sorted(set(self.previous.entities) - set(used)):
            prefix = self.previous.entities[name].get("prefix")
            self.plan.warnings.append(
                f"entity type {name} (prefix {prefix}) is no longer imported: the keys written under its prefix stay until "
                "their TTL, and stored.lock keeps what they hold"
            )
        self.plan.lines[:0] = lines
        return out

    def source_def(self, d: _Draft, et: _EntityType, why: str) -> SourceDef | None:
        name = d.view["name"]
        previous = self.previous.sources.get(name, {})
        kept = {k: v for k, v in previous.items() if k in KEPT_SOURCE_KEYS}
        dropped = previous.get(OLD_MAX_AGE)
        if dropped is not None and dropped != d.ttl_seconds:  # not what the earlier import wrote: set by hand
            kept["max_age_seconds"], dropped = dropped, None
        key_columns = list(d.key_columns) if list(d.key_columns) != [k.name for k in d.keys] else None
        spec = dict(
            name=name,
            entity=et.name,
            **d.where,
            layout="wide",
            select_by="event_time",
            timestamp_column=d.timestamp_column,
            created_column=d.created_column,
            on_tie="keep_one",  # Feast writes one of an entity's tied rows, never fails a view
            key_columns=key_columns,
            push_source=d.push_source,
            feast_ttl_seconds=d.ttl_seconds,  # a reader serves a value however old, as Feast's; max_age_seconds is the operator's
            features=d.features,
            description=d.view.get("description") or "",
        )
        try:
            source = SourceDef(**{**spec, **kept})
        except ValidationError:
            try:
                source = SourceDef(**spec)
                self.plan.warnings.append(f"source {name}: {', '.join(sorted(kept))} from the earlier output no longer fit: dropped")
            except ValidationError as exc:
                self.left_out(f"feature view {name}", " ".join(str(exc).split())[:300])
                return None
        ttl, notes = _reads_said(source, d, dropped, previous.get(EARLIER_TTL))
        keys = f", key columns {', '.join(key_columns)} (Feast's field_mapping)" if key_columns else ""
        created = f", created_column {d.created_column}" if d.created_column else ""
        on = f"entity type {et.name}" + (f" ({why})" if why else "")
        push = f", push_source {source.push_source}" if source.push_source else ""
        self.plan.lines.append(
            f"source {name} (feature view): {d.where_text}, {on}, select_by event_time, timestamp_column "
            f"{d.timestamp_column}{created}{keys}, {ttl}{push}, layout wide, on_tie {source.on_tie}"
        )
        if source.on_tie == "keep_one":
            d.notes.append(
                "an entity's rows of one event time (and created time) with different values: one is written, as Feast "
                "writes one, though maybe not the same one (here the same on every run); on_tie: fail stops the run instead"
            )
        d.notes.extend(notes)
        self.plan.lines.extend(f"  note: {n}" for n in d.notes)
        self.plan.lines.extend(d.feature_lines)
        return source

    # --- the rest ------------------------------------------------------------------------------
    def services(self, sources: dict[str, SourceDef]) -> None:
        odfvs = {v["name"] for v in self.dump.get("on_demand_feature_views", [])}
        for fs in sorted(self.dump.get("feature_services", []), key=lambda s: s["name"]):
            name, refs, dropped = fs["name"], [], []
            if not fits("identifier", name):
                self.left_out(f"feature service {name}", f"the name does not fit: {_RULES['identifier']}")
                continue
            wanted = []
            for p in fs.get("projections", []):
                view = p["feature_view"]
                if p.get("name_alias") or p.get("join_key_map") or p.get("name_to_use", view) != view:
                    how = "an alias" if p.get("name_alias") else "a join key map" if p.get("join_key_map") else "a version"
                    dropped.append((view, f"{how}: no such projection here"))
                    continue
                wanted += [(view, f) for f in p["features"]]
            for ref in fs.get("pending_refs", []):
                view, _, feature = ref.partition(":")
                source = sources.get(view)
                names = [feature] if feature else [f.name for f in source.features] if source else [""]
                wanted += [(view, n) for n in names]
            for view, feature in wanted:
                source = sources.get(view)
                ref = f"{view}:{feature}" if feature else view
                if source is None:
                    why = (
                        "an on-demand feature view (Feast computes it at request time)" if view in odfvs else "its view is not carried over"
                    )
                    dropped.append((ref, why))
                elif feature not in {f.name for f in source.features}:
                    dropped.append((ref, "the feature is not carried over"))
                elif ref not in refs:
                    refs.append(ref)
            for why, group in _grouped(dropped).items():
                self.left_out(f"feature service {name}: reference{'s' if len(group) > 1 else ''} {', '.join(group)}", why)
            if not refs:
                self.left_out(f"feature service {name}", "none of its features is carried over")
                continue
            self.plan.services.append(FeatureServiceDef(name=name, features=refs, description=fs.get("description") or ""))
            self.plan.lines.append(f"feature service {name}: {len(refs)} reference(s) ({', '.join(refs)})")

    def _why_left_out(self, view: str) -> str:
        """The reason the plan gives for leaving out feature view ``view``."""
        for kind in ("feature view", "stream feature view"):
            found = [line for line in self.plan.left_out if line.startswith(f"{kind} {view}: ")]
            if found:
                return found[0][len(f"{kind} {view}: ") :]
        return "left out"

    def _push_source(self, name: str, reading: list[str], sources: dict[str, SourceDef]) -> None:
        """A PushSource: mapped to the ``push_source`` of the imported views that read it, else left out, saying why."""
        pushed = [v for v in reading if v in sources and sources[v].push_source == name]
        if pushed:
            others = [v for v in reading if v not in pushed]
            not_here = f" ({', '.join(others)}: not imported, see left out)" if others else ""
            self.plan.lines.append(f"push source {name}: pushes write {', '.join(pushed)}{not_here}")
            return
        imported = [v for v in reading if v in sources]
        if imported:  # its name does not fit: the views are imported from their batch source
            why = f"the name does not fit: {_RULES['identifier']} ({', '.join(imported)}: imported from its batch source, no push_source)"
        elif reading:
            why = "no view that reads it is imported: " + "; ".join(f"{v} ({self._why_left_out(v)})" for v in reading)
        else:
            why = "no feature view reads it: a push here writes the sources of the feature views that read its push source"
        self.left_out(f"push source {name}", why)

    def the_rest(self, used: dict[str, _EntityType], sources: dict[str, SourceDef]) -> None:
        readers: dict[str, list[str]] = {}
        reading: dict[str, list[str]] = {}  # every feature view of a stream source, imported or not
        for v in sorted(self.dump.get("feature_views", []), key=lambda v: v["name"]):
            if v.get("stream_source"):
                reading.setdefault(v["stream_source"]["name"], []).append(v["name"])
                if v["name"] in sources:
                    readers.setdefault(v["stream_source"]["name"], []).append(v["name"])
        for v in sorted(self.dump.get("on_demand_feature_views", []), key=lambda v: v["name"]):
            self.left_out(
                f"on-demand feature view {v['name']}",
                "Feast computes it at request time with Python code (from request data and other views); this project serves stored values",
            )
        for v in sorted(self.dump.get("label_views", []), key=lambda v: v["name"]):
            self.left_out(f"label view {v['name']}", "labels that people and tools push; Feast never materializes a label view")
        seen = set()
        for s in sorted(self.dump.get("data_sources", []), key=lambda s: (s["class"], s["name"])):
            if (s["class"], s["name"]) in seen:
                continue
            seen.add((s["class"], s["name"]))
            read = readers.get(s["name"], [])
            by_batch = f" ({', '.join(read)}: imported from its batch source)" if read else ""
            if s["class"] == "PushSource":
                self._push_source(s["name"], reading.get(s["name"], []), sources)
            elif s["class"] in STREAMS:
                self.left_out(f"stream source {s['name']} ({s['class']})", f"the job reads tables, not streams{by_batch}")
            elif s["class"] == "RequestSource":
                self.left_out(f"request source {s['name']}", "data of a request, for on-demand feature views")
        in_use = {n for et in used.values() for n in et.entity_names}
        for name in sorted(set(self.entities) - in_use):
            self.left_out(f"entity {name}", "no imported feature view uses it")


def _grouped(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    """(what, why) pairs as why -> [what, ...], in first-seen order."""
    out: dict[str, list[str]] = {}
    for what, why in pairs:
        out.setdefault(why, []).append(what)
    return out


def _keys_text(keys) -> str:
    return ", ".join(f"{k.name} {k.type}" for k in keys)


def derive_prefix(name: str, taken: set[str]) -> str:
    """A short Redis key prefix for entity type ``name``, not in ``taken``: the initials of its
    words (``customer_account``: ``ca``), else its first letters, one more at a time, else the
    initials with a number. Stable for a name; the import keeps a prefix once written."""
    lowered = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "_" for c in name.lower())
    words = [w for w in lowered.split("_") if w]
    initials = "".join(w[0] for w in words)[:16] or "e"
    letters = lowered.replace("_", "") or "e"
    for candidate in [initials, *(letters[:n] for n in range(1, min(len(letters), 16) + 1))]:
        if candidate not in taken and fits("prefix", candidate):
            return candidate
    n = 2
    while f"{initials[:12]}{n}" in taken:
        n += 1
    return f"{initials[:12]}{n}"


def sql_table_name(entity_type: str) -> str:
    """``<entity type>_features``, cut to an identifier's 63 characters (with a digest to stay unique)."""
    name = f"{entity_type}_features"
    if len(name) <= 63:
        return name
    return f"{entity_type[:48]}_{hashlib.sha256(entity_type.encode()).hexdigest()[:5]}_features"


def map_repo(dump: dict, repo: Path, project: str, previous: Previous | None = None, key_ttl_seconds: int | None = None) -> Plan:
    """The definitions of the Feast repository ``repo`` whose objects ``dump`` holds."""
    twice = [
        f"{repo}: two {kind} named {name!r} (Feast's apply refuses that too)"
        for key, kind in (("entities", "entities"), ("feature_views", "feature views"), ("feature_services", "feature services"))
        for name, n in sorted(Counter(o["name"] for o in dump.get(key, [])).items())
        if n > 1
    ]
    if twice:
        raise FeastImportError(twice)
    m = _Mapper(dump, repo, project, previous or Previous(), key_ttl_seconds)
    drafts = {}
    for view in sorted(dump.get("feature_views", []), key=lambda v: v["name"]):
        d = m.draft({**view, "config_error": dump.get("config_error")})
        if d is not None:
            drafts[view["name"]] = d
    placed = m.assign(drafts)
    sources, used = {}, {}
    for name in sorted(placed):
        d, et, why = placed[name]
        source = m.source_def(d, et, why)
        if source is not None:
            sources[name] = source
            used.setdefault(et.name, et)
    m.plan.sources = [sources[n] for n in sorted(sources)]
    m.plan.entities = m.entity_defs(used)
    m.the_rest(used, sources)
    m.services(sources)
    return m.plan
