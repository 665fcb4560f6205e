"""Load and cross-check every definition file of a folder.

A file holds either ``entities:`` (the entity types) or ``source:`` (one source table).
All problems found are reported together, each as ``file:line: where: problem``.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from feature_defs.models import (
    EntitiesFile,
    EntityDef,
    FeatureServiceDef,
    FeatureServicesFile,
    SourceDef,
    SourceFile,
    value_type_problem,
    yaml_text,
)
from feature_defs.stored_lock import LOCK_NAME, Lock, LockFileError, changes, next_stored_name, read_lock
from feature_defs.yamlio import YamlFileError, describe_validation_error, line_of, load_yaml, read_file, written_at
from serializers import field_id_int, freshness_field_name, subsecond_field_name

DEFAULT_DIR = Path(__file__).resolve().parent
if os.environ.get("FM_PROJECT_ROOT") or not DEFAULT_DIR.is_dir():
    # as fm_config's PROJECT_ROOT: FM_PROJECT_ROOT, else (imported from the --py-files
    # zip) the working directory's checkout
    DEFAULT_DIR = Path(os.environ.get("FM_PROJECT_ROOT") or Path.cwd()).resolve() / "feature_defs"


class DefinitionError(ValueError):
    """Feature definitions that cannot be used; lists every problem found."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("invalid feature definitions:\n  " + "\n  ".join(problems))


class UnknownNameError(KeyError):
    """A source or entity name (from the command line or config) that no definition has."""

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError's own str() would quote the message


@dataclass(frozen=True)
class Definitions:
    entities: dict[str, EntityDef]
    sources: dict[str, SourceDef]
    files: dict[str, Path] = field(default_factory=dict)
    """Which file each entity/source came from (keys 'entity:NAME' / 'source:NAME')."""
    digest: str = ""
    """sha256 of the definition files' contents: identifies this set of definitions."""
    services: dict[str, FeatureServiceDef] = field(default_factory=dict)
    """Named feature sets for readers (``feature_services:`` files)."""
    lines: dict[str, int] = field(default_factory=dict)
    """Line of each definition, by the same keys and 'source:NAME:FEATURE'."""
    lock: Lock | None = None
    """The folder's stored.lock (what the stores hold under each stored name), if it has one."""
    extra_expectations: tuple = ()
    """(``file:line: source 'S': expectations[I] TYPE``, the expectation) of every source's own
    expectation whose column and values passed the load's checks: what :meth:`check_expectations`
    asks great-expectations about."""

    def check_expectations(self) -> None:
        """The sources' own expectations against great-expectations itself (a class of that
        name, arguments it accepts): a DefinitionError naming file and line.

        Loading does not do this: importing great-expectations takes seconds and memory that
        the reader, the feature server and most commands never need. Whatever runs
        expectations (a run with the gate's expectations on, ``validate``, ``defs``) calls it
        first, before anything is written."""
        if self._expectation_problems:
            raise DefinitionError(list(self._expectation_problems))

    @cached_property
    def _expectation_problems(self) -> tuple[str, ...]:
        return tuple(f"{where}: {problem}" for where, extra in self.extra_expectations if (problem := _great_expectations_problem(extra)))

    def place(self, source: SourceDef, feature) -> str:
        """``file:line: source 'S': feature 'F'``, for messages about one feature."""
        line = self.lines.get(f"source:{source.name}:{feature.name}")
        path = self.files.get(f"source:{source.name}", "")
        return f"{path}{f':{line}' if line else ''}: source {source.name!r}: feature {feature.name!r}"

    def source(self, name: str) -> SourceDef:
        try:
            return self.sources[name]
        except KeyError:
            raise UnknownNameError(f"unknown source {name!r}; defined sources: {', '.join(sorted(self.sources))}") from None

    def entity(self, name: str) -> EntityDef:
        try:
            return self.entities[name]
        except KeyError:
            raise UnknownNameError(f"unknown entity {name!r}; defined entities: {', '.join(sorted(self.entities))}") from None

    def entity_of(self, source: SourceDef) -> EntityDef:
        return self.entities[source.entity]

    def sources_of(self, entity: str) -> list[SourceDef]:
        return [s for s in self.sources.values() if s.entity == entity]

    def service(self, name: str) -> FeatureServiceDef:
        try:
            return self.services[name]
        except KeyError:
            raise UnknownNameError(f"unknown feature service {name!r}; defined: {', '.join(sorted(self.services)) or 'none'}") from None


def load_definitions(directory: Path | str | None = None, *, check_lock: bool = True) -> Definitions:
    """Load and check every definition file of ``directory``; with ``check_lock`` (all but
    ``materialize defs --lock``), also against its stored.lock when there is one."""
    directory = Path(directory) if directory else DEFAULT_DIR
    files = sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    if not files:
        raise DefinitionError([f"{directory}: no *.yaml definition files"])
    found = _Found()
    for path in files:
        _read_definition_file(path, found)

    lock = None
    try:
        lock = read_lock(directory)
        if lock is not None:
            found.digest.update(LOCK_NAME.encode() + b"\0" + (directory / LOCK_NAME).read_bytes() + b"\0")
    except LockFileError as exc:
        found.problems.append(str(exc))
    extra_expectations: list = []
    found.problems.extend(_cross_checks(found.entities, found.sources, found.where, found.lines, found.nodes, extra_expectations, lock))
    found.problems.extend(_service_problems(found.services, found.sources, _Places(found.where, found.lines, found.nodes)))
    if found.problems:
        raise DefinitionError(found.problems)
    defs = Definitions(
        entities=found.entities,
        sources=found.sources,
        files=found.where,
        lines={k: v for k, v in found.lines.items() if v},
        digest=found.digest.hexdigest(),
        services=found.services,
        extra_expectations=tuple(extra_expectations),
        lock=lock,
    )
    if check_lock and lock is not None:
        changed = changes(defs, lock)
        if changed:
            raise DefinitionError([c.line() for c in changed])
    return defs


@dataclass
class _Found:
    """What the definition files of a folder hold, as read so far, and the problems met."""

    problems: list[str] = field(default_factory=list)
    entities: dict[str, EntityDef] = field(default_factory=dict)
    sources: dict[str, SourceDef] = field(default_factory=dict)
    services: dict[str, FeatureServiceDef] = field(default_factory=dict)
    where: dict[str, Path] = field(default_factory=dict)
    """The file of each definition, by key ('entity:NAME', 'service:NAME', 'source:NAME')."""
    lines: dict[str, int | None] = field(default_factory=dict)
    """The line of each definition by the same keys, and of a source's features and expectations."""
    nodes: dict[str, yaml.Node] = field(default_factory=dict)
    """Each source's YAML node, for the lines of what the cross-checks find."""
    digest: Any = field(default_factory=hashlib.sha256)
    """sha256 of the files read (name and bytes of each): the Definitions' digest."""


def _read_definition_file(path: Path, found: _Found) -> None:
    """Read one definition file into ``found``; what is wrong with it goes to ``found.problems``."""
    try:
        raw = read_file(path)  # a folder, FIFO or dangling symlink named *.yaml is a problem, not a crash
        found.digest.update(path.name.encode() + b"\0" + raw + b"\0")
        data, node = load_yaml(path, raw)
    except YamlFileError as exc:
        found.problems.append(str(exc))
        return
    if not isinstance(data, dict) or not ({"entities", "source", "feature_services"} & set(data)):
        found.problems.append(
            f"{path}:{line_of(node, []) or 1}: expected a top-level 'entities:' list, a 'source:' mapping or a 'feature_services:' list"
        )
        return
    try:
        if "feature_services" in data or "entities" in data:
            _add_named_items(path, data, node, found)
        else:
            _add_source(path, data, node, found)
    except ValidationError as exc:
        found.problems.extend(describe_validation_error(exc, path, node))


def _add_named_items(path: Path, data: dict, node: yaml.Node, found: _Found) -> None:
    """A file's ``feature_services:`` (else ``entities:``) list: each name defined once over all files."""
    if "feature_services" in data:
        top, kind, label, table = "feature_services", "service", "feature service", found.services
        items = FeatureServicesFile.model_validate(data).feature_services
    else:
        top, kind, label, table = "entities", "entity", "entity", found.entities
        items = EntitiesFile.model_validate(data).entities
    where, lines = found.where, found.lines
    for i, item in enumerate(items):
        key, at = f"{kind}:{item.name}", line_of(node, [top, i])
        if item.name in table:
            found.problems.append(f"{path}:{at}: {label} {item.name!r} is already defined at {where[key]}:{lines[key]}")
            continue
        table[item.name], where[key], lines[key] = item, path, at


def _add_source(path: Path, data: dict, node: yaml.Node, found: _Found) -> None:
    """A file's ``source:``, defined once over all files, with the lines of its features and expectations."""
    source = SourceFile.model_validate(data).source
    key = f"source:{source.name}"
    where, lines = found.where, found.lines
    if source.name in found.sources:
        found.problems.append(
            f"{path}:{line_of(node, ['source', 'name'])}: source {source.name!r} is already defined at {where[key]}:{lines[key]}"
        )
        return
    found.sources[source.name], where[key], found.nodes[key] = source, path, node
    lines[key] = line_of(node, ["source"])
    for i, feature in enumerate(source.features):
        lines[f"{key}:{feature.name}"] = lines[f"{key}:features:{i}"] = line_of(node, ["source", "features", i])
    for i in range(len(source.expectations)):
        lines[f"{key}:expectations:{i}"] = line_of(node, ["source", "expectations", i])


def _service_problems(services, sources, places) -> list[str]:
    """Every reference of a feature service names a defined source (and feature), each feature once."""
    problems = []
    for service in services.values():
        seen: dict[str, str] = {}
        for ref in service.features:
            source_name, _, feature = ref.partition(":")
            source = sources.get(source_name)
            if source is None:
                problems.append(
                    f"{places.at(f'service:{service.name}')}: feature service {service.name!r}: unknown source {source_name!r} in {ref!r}"
                )
            elif feature and feature not in {f.name for f in source.features}:
                problems.append(
                    f"{places.at(f'service:{service.name}')}: feature service {service.name!r}: "
                    f"source {source_name!r} has no feature {feature!r}"
                )
            else:  # a response's columns are read by position: a feature twice is a mistake
                for name in [feature] if feature else [f.name for f in source.features]:
                    key = f"{source_name}:{name}"
                    if key in seen:
                        problems.append(
                            f"{places.at(f'service:{service.name}')}: feature service {service.name!r}: "
                            f"feature {key!r} is listed twice ({seen[key]!r} and {ref!r})"
                        )
                    seen.setdefault(key, ref)
    return problems


# Expectations whose min_value/max_value are values of the column (others bound a length, a count, a mean).
VALUE_BOUNDS = frozenset({"expect_column_values_to_be_between", "expect_column_min_to_be_between", "expect_column_max_to_be_between"})


def _extra_expectation_values(extra) -> list[tuple[tuple, object]]:
    """(place under kwargs, value) of every kwarg that holds values of the expectation's column."""
    found: list[tuple[tuple, object]] = []
    if isinstance(extra.kwargs.get("value_set"), list):
        found += [(("value_set", i), v) for i, v in enumerate(extra.kwargs["value_set"])]
    if extra.type in VALUE_BOUNDS:
        found += [((k,), extra.kwargs[k]) for k in ("min_value", "max_value") if extra.kwargs.get(k) is not None]
    return found


def _extra_expectation_problem(extra, columns: dict[str, str]) -> str | None:
    """Is this expectation on one known column, with only its own arguments? (What
    great-expectations makes of it: :meth:`Definitions.check_expectations`.)"""
    column = extra.kwargs.get("column")
    if column is not None and not isinstance(column, str):
        return f"kwargs.column: expected one column name, found a {type(column).__name__}: write one expectation per column"
    if column is not None and column not in columns:
        return f"column {column!r} is not a feature or key of this source"
    reserved = {"meta", "notes"} & set(extra.kwargs)
    if reserved:
        return f"kwargs {sorted(reserved)} are set by the job (name and severity), not in the definition"
    return None


def _great_expectations_problem(extra) -> str | None:
    """Is this a great-expectations expectation, built from these kwargs?"""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # as jobs/pipeline/gate/checks.py: no network calls
    import great_expectations.expectations as gxe  # slow: only when something runs expectations
    from pydantic import ValidationError as GxValidationError

    cls = getattr(gxe, extra.class_name, None)
    if cls is None:
        return f"not a great-expectations expectation (no class {extra.class_name})"
    try:
        cls(**extra.kwargs)
    except (GxValidationError, TypeError, ValueError) as exc:
        return f"invalid kwargs: {' '.join(str(exc).split())[:300]}"
    return None


@dataclass(frozen=True)
class _Places:
    """Where each definition was read: file per entity/source, lines and YAML nodes by key."""

    where: dict
    lines: dict
    nodes: dict

    def at(self, key: str) -> str:
        """file:line of 'entity:NAME', 'source:NAME', 'source:NAME:FEATURE', 'source:NAME:features:I' or 'source:NAME:expectations:I'."""
        line = self.lines.get(key)
        path = self.where[":".join(key.split(":")[:2])]
        return f"{path}:{line}" if line else str(path)


def _cross_checks(entities, sources, where, lines, nodes, extra_expectations: list, lock: Lock | None = None) -> list[str]:
    places = _Places(where, lines, nodes)
    problems = []
    for source in sources.values():
        entity = entities.get(source.entity)
        if entity is None:
            defined = ", ".join(sorted(entities)) or "none"
            problems.append(
                f"{places.at(f'source:{source.name}')}: source {source.name!r}: unknown entity {source.entity!r} (defined: {defined})"
            )
            continue
        problems += _key_column_problems(source, entity, places)
        problems += _expectation_problems(source, entity, places, extra_expectations)
        problems += _feature_name_problems(source, places)
    problems += _prefix_problems(entities, places)
    for entity in entities.values():
        held = set(lock.entities.get(entity.name, {})) if lock else set()
        problems += _field_id_problems(entity, [s for s in sources.values() if s.entity == entity.name], places, held)
    return problems


def _key_column_problems(source, entity, places: _Places) -> list[str]:
    if source.key_columns is None or len(source.key_columns) == len(entity.keys):
        return []
    return [
        f"{places.at(f'source:{source.name}')}: source {source.name!r}: key_columns has {len(source.key_columns)} columns, "
        f"entity {entity.name!r} has {len(entity.keys)} key parts"
    ]


def _expectation_problems(source, entity, places: _Places, extra_expectations: list) -> list[str]:
    """Extra expectations: one known column, values of its type. Those that pass join
    ``extra_expectations``, for great-expectations' own check later."""
    skey, problems = f"source:{source.name}", []
    # column -> type of its values, for the checks' arguments
    columns = dict(zip(source.key_columns or [k.name for k in entity.keys], [k.type for k in entity.keys]))
    columns |= {f.name: f.type for f in source.features}
    for i, extra in enumerate(source.expectations):
        column = extra.kwargs.get("column")
        wrong_values = 0
        for place, value in _extra_expectation_values(extra) if isinstance(column, str) and column in columns else []:
            wrong = value_type_problem(columns[column], value, of=f"column {column!r}")
            if wrong:
                loc = ["source", "expectations", i, "kwargs", *place]
                wrong = wrong.replace("{written}", written_at(places.nodes[skey], loc) or yaml_text(value))
                problems.append(
                    f"{places.where[skey]}:{line_of(places.nodes[skey], loc)}: source {source.name!r}: expectations[{i}] {extra.type}: "
                    f"kwargs.{'.'.join(map(str, place))}: {wrong}"
                )
                wrong_values += 1
        if wrong_values:
            continue
        where = f"{places.at(f'{skey}:expectations:{i}')}: source {source.name!r}: expectations[{i}] {extra.type}"
        problem = _extra_expectation_problem(extra, columns)
        if problem:
            problems.append(f"{where}: {problem}")
        else:
            extra_expectations.append((where, extra))
    return problems


def _feature_name_problems(source, places: _Places) -> list[str]:
    """One feature per name; in a long layout, one feature per name of the name column."""
    skey, problems = f"source:{source.name}", []
    seen: set[str] = set()
    by_column: dict[str, int] = {}
    for i, feature in enumerate(source.features):
        if feature.name in seen:
            problems.append(
                f"{places.at(f'{skey}:features:{i}')}: source {source.name!r}: feature #{i + 1}: duplicate feature name {feature.name!r}"
            )
            continue
        seen.add(feature.name)
        first = by_column.setdefault(feature.source_column, i)
        if source.layout == "long" and first != i:
            # the pivot keeps one feature per name: the run would fail after reading the table
            other = source.features[first]
            problems.append(
                f"{places.at(f'{skey}:features:{i}')}: source {source.name!r}: features {other.name!r} "
                f"(line {places.lines.get(f'{skey}:features:{first}')}) "
                f"and {feature.name!r} both read the rows where {source.name_column} is {feature.source_column!r}: "
                f"a long layout gives each name to one feature (set another 'column', or drop one)"
            )
    return problems


def _prefix_problems(entities, places: _Places) -> list[str]:
    problems, prefixes = [], {}
    for entity in entities.values():
        if entity.prefix in prefixes:
            problems.append(
                f"{places.at(f'entity:{entity.name}')}: entity {entity.name!r} has key prefix {entity.prefix!r}, "
                f"like entity {prefixes[entity.prefix]!r}: their Redis keys would mix"
            )
        prefixes.setdefault(entity.prefix, entity.name)
    return problems


def _field_id_problems(entity, sources, places: _Places, held: set[str] = frozenset()) -> list[str]:
    """Stored names and field ids are unique per entity type, across all of its sources (one hash
    per entity holds them all); a feature's name only within its source (``held``: the stored
    names the lock knows, never suggested)."""
    problems, ids, stored = [], {}, {}
    taken = held | {f.stored_name for s in sources for f in s.features}
    for source in sources:
        skey = f"source:{source.name}"
        reserved = [(freshness_field_name(source.name), "freshness field")]
        if source.by_event_time:  # its sub-second field too (FORMAT.md 1.4)
            reserved.append((subsecond_field_name(source.name), "sub-second field"))
        for name, what in reserved:
            fid = field_id_int(name)
            if fid in ids:
                problems.append(
                    f"{places.at(skey)}: field id collision in entity {entity.name!r}: {name!r} and {ids[fid]} both have field id {fid}"
                )
            ids.setdefault(fid, f"{name!r} ({what} of source {source.name!r})")
        for feature in source.features:
            fkey = f"{skey}:{feature.name}"
            label = f"feature {feature.name!r} of source {source.name!r}"
            if feature.stored_name in stored:
                fresh = next_stored_name(feature.stored_name, taken)
                taken.add(fresh)  # a third source of the name is told another
                problems.append(
                    f"{places.at(fkey)}: entity {entity.name!r}: {label} is stored as {feature.stored_name!r}, like "
                    f"{stored[feature.stored_name]}: give it fresh storage with `stored_as: {fresh}`"
                )
                continue
            stored[feature.stored_name] = label
            if feature.field_id in ids and ids[feature.field_id] != label:
                problems.append(
                    f"{places.at(fkey)}: field id collision in entity {entity.name!r}: {label} and {ids[feature.field_id]} "
                    f"both have field id {feature.field_id}"
                )
            ids.setdefault(feature.field_id, label)
    return problems
