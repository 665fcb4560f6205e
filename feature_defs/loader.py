"""Load and cross-check every definition file of a folder.

A file holds either ``entities:`` (the entity types) or ``source:`` (one source table).
All problems found are reported together, each as ``file:line: where: problem``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import ValidationError

from feature_defs.models import EntitiesFile, EntityDef, SourceDef, SourceFile
from feature_defs.yamlio import YamlFileError, describe_validation_error, line_of, load_yaml
from serializers import freshness_field_name

DEFAULT_DIR = Path(__file__).resolve().parent
if os.environ.get("FM_PROJECT_ROOT") or not DEFAULT_DIR.is_dir():
    # as jobs.config's PROJECT_ROOT: FM_PROJECT_ROOT, else (imported from the --py-files
    # zip) the working directory's checkout
    DEFAULT_DIR = Path(os.environ.get("FM_PROJECT_ROOT") or Path.cwd()).resolve() / "feature_defs"


class DefinitionError(ValueError):
    """Feature definitions that cannot be used; lists every problem found."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid feature definitions:\n  " + "\n  ".join(problems))


@dataclass(frozen=True)
class Definitions:
    entities: dict[str, EntityDef]
    sources: dict[str, SourceDef]
    files: dict[str, Path] = field(default_factory=dict)
    """Which file each entity/source came from (keys 'entity:NAME' / 'source:NAME')."""
    digest: str = ""
    """sha256 of the definition files' contents: identifies this set of definitions."""

    def source(self, name: str) -> SourceDef:
        try:
            return self.sources[name]
        except KeyError:
            raise KeyError(f"unknown source {name!r}; defined sources: {', '.join(sorted(self.sources))}") from None

    def entity_of(self, source: SourceDef) -> EntityDef:
        return self.entities[source.entity]

    def sources_of(self, entity: str) -> list[SourceDef]:
        return [s for s in self.sources.values() if s.entity == entity]


def load_definitions(directory: Path | str | None = None) -> Definitions:
    directory = Path(directory) if directory else DEFAULT_DIR
    files = sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    if not files:
        raise DefinitionError([f"{directory}: no *.yaml definition files"])
    problems: list[str] = []
    entities: dict[str, EntityDef] = {}
    sources: dict[str, SourceDef] = {}
    where: dict[str, Path] = {}
    lines: dict[str, int | None] = {}
    digest = hashlib.sha256()

    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
        try:
            data, node = load_yaml(path)
        except YamlFileError as exc:
            problems.append(str(exc))
            continue
        if not isinstance(data, dict) or not ({"entities", "source"} & set(data)):
            problems.append(f"{path}:{line_of(node, []) or 1}: expected a top-level 'entities:' list or a 'source:' mapping")
            continue
        try:
            if "entities" in data:
                for i, entity in enumerate(EntitiesFile.model_validate(data).entities):
                    key = f"entity:{entity.name}"
                    if entity.name in entities:
                        problems.append(f"{path}:{line_of(node, ['entities', i])}: entity {entity.name!r} is already defined at {where[key]}:{lines[key]}")
                        continue
                    entities[entity.name], where[key] = entity, path
                    lines[key] = line_of(node, ["entities", i])
            else:
                source = SourceFile.model_validate(data).source
                key = f"source:{source.name}"
                if source.name in sources:
                    problems.append(f"{path}:{line_of(node, ['source', 'name'])}: source {source.name!r} is already defined at {where[key]}:{lines[key]}")
                    continue
                sources[source.name], where[key] = source, path
                lines[key] = line_of(node, ["source"])
                for i, feature in enumerate(source.features):
                    lines[f"{key}:{feature.name}"] = lines[f"{key}:features:{i}"] = line_of(node, ["source", "features", i])
                for i, extra in enumerate(source.expectations):
                    lines[f"{key}:expectations:{i}"] = line_of(node, ["source", "expectations", i])
        except ValidationError as exc:
            problems.extend(describe_validation_error(exc, path, node))

    problems.extend(_cross_checks(entities, sources, where, lines))
    if problems:
        raise DefinitionError(problems)
    return Definitions(entities=entities, sources=sources, files=where, digest=digest.hexdigest())


def _extra_expectation_problem(extra, columns: set[str]) -> str | None:
    """Is this a great-expectations expectation, built from these kwargs, on a known column?"""
    import great_expectations.expectations as gxe  # only when a source declares extra checks (slow import)
    from pydantic import ValidationError as GxValidationError

    cls = getattr(gxe, extra.class_name, None)
    if cls is None:
        return f"not a great-expectations expectation (no class {extra.class_name})"
    reserved = {"meta", "notes"} & set(extra.kwargs)
    if reserved:
        return f"kwargs {sorted(reserved)} are set by the job (name and severity), not in the definition"
    column = extra.kwargs.get("column")
    if column is not None and column not in columns:
        return f"column {column!r} is not a feature or key of this source"
    try:
        cls(**extra.kwargs)
    except (GxValidationError, TypeError, ValueError) as exc:
        return f"invalid kwargs: {' '.join(str(exc).split())[:300]}"
    return None


def _cross_checks(entities, sources, where, lines) -> list[str]:
    problems = []

    def at(key: str) -> str:
        """file:line of 'entity:NAME', 'source:NAME', 'source:NAME:FEATURE', 'source:NAME:features:I' or 'source:NAME:expectations:I'."""
        line = lines.get(key)
        path = where[":".join(key.split(":")[:2])]
        return f"{path}:{line}" if line else str(path)

    for source in sources.values():
        skey = f"source:{source.name}"
        entity = entities.get(source.entity)
        if entity is None:
            problems.append(f"{at(skey)}: source {source.name!r}: unknown entity {source.entity!r} (defined: {', '.join(sorted(entities)) or 'none'})")
            continue
        if source.key_columns is not None and len(source.key_columns) != len(entity.keys):
            problems.append(
                f"{at(skey)}: source {source.name!r}: key_columns has {len(source.key_columns)} columns, "
                f"entity {entity.name!r} has {len(entity.keys)} key parts"
            )
        columns = {f.name for f in source.features} | set(source.key_columns or [k.name for k in entity.keys])
        for i, extra in enumerate(source.expectations):
            problem = _extra_expectation_problem(extra, columns)
            if problem:
                problems.append(f"{at(f'{skey}:expectations:{i}')}: source {source.name!r}: expectations[{i}] {extra.type}: {problem}")
        seen: set[str] = set()
        for i, feature in enumerate(source.features):
            if feature.name in seen:
                problems.append(f"{at(f'{skey}:features:{i}')}: source {source.name!r}: feature #{i + 1}: duplicate feature name {feature.name!r}")
            seen.add(feature.name)

    prefixes: dict[str, str] = {}
    for entity in entities.values():
        if entity.prefix in prefixes:
            problems.append(f"{at(f'entity:{entity.name}')}: entity {entity.name!r} has key prefix {entity.prefix!r}, like entity {prefixes[entity.prefix]!r}: their Redis keys would mix")
        prefixes.setdefault(entity.prefix, entity.name)

    # Names and field ids must be unique per entity type, across all of its sources.
    for entity in entities.values():
        owners: dict[str, str] = {}
        ids: dict[int, str] = {}
        for source in (s for s in sources.values() if s.entity == entity.name):
            skey = f"source:{source.name}"
            ts_name = freshness_field_name(source.name)
            if source.freshness_field_id in ids:
                problems.append(
                    f"{at(skey)}: field id collision in entity {entity.name!r}: {ts_name!r} and {ids[source.freshness_field_id]} "
                    f"both have field id {source.freshness_field_id}"
                )
            ids.setdefault(source.freshness_field_id, f"{ts_name!r} (freshness field of source {source.name!r})")
            for feature in source.features:
                fkey = f"{skey}:{feature.name}"
                label = f"feature {feature.name!r} of source {source.name!r}"
                if feature.name in owners and owners[feature.name] != source.name:
                    problems.append(f"{at(fkey)}: entity {entity.name!r}: {label} is also defined by source {owners[feature.name]!r}")
                    continue
                owners[feature.name] = source.name
                if feature.field_id in ids and not ids[feature.field_id].startswith(f"feature {feature.name!r}"):
                    problems.append(
                        f"{at(fkey)}: field id collision in entity {entity.name!r}: {label} and {ids[feature.field_id]} "
                        f"both have field id {feature.field_id}"
                    )
                ids.setdefault(feature.field_id, label)
    return problems
