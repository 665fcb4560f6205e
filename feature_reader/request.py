"""A request in Feast's shape, checked against the definitions: which features (as
``source:feature``, a source's name, or a feature service), for which entities (a dict of
key columns), under which names in the response."""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass
from typing import Any

from feature_defs import Definitions, EntityDef, FeatureDef, SourceDef
from feature_reader.errors import EntityKeyError, RequestError, UnknownNameError, shown
from feature_reader.memo import BoundedMemo, names_bytes
from serializers.keys import entity_id

_BAD_STRING_PART = re.compile(r"[:\x00-\x1f\x7f\ud800-\udfff]")  # lone surrogates: no UTF-8 (a key is UTF-8)


@dataclass(frozen=True)
class Column:
    """One requested feature: a column of the response."""

    source: SourceDef
    feature: FeatureDef
    name: str
    """Its name in the response: the feature's, or ``source__feature`` (full_feature_names)."""


def resolve_features(defs: Definitions, features: list[str] | None, feature_service: str | None) -> list[tuple[SourceDef, FeatureDef]]:
    """The (source, feature) pairs named by references or a feature service, in order. A feature
    named twice (the same reference, or a feature and its source's name) is a RequestError:
    clients map the response's columns by position."""
    if feature_service is not None:
        if features:
            raise RequestError("give either features or feature_service, not both")
        if feature_service not in defs.services:
            raise UnknownNameError("feature service", feature_service, list(defs.services))
        features = defs.services[feature_service].features
    if not features:
        raise RequestError("no features requested: give features (source:feature or a source name) or feature_service")
    out: dict[tuple[str, str], tuple[SourceDef, FeatureDef]] = {}
    via: dict[tuple[str, str], str] = {}
    for ref in features:
        if not isinstance(ref, str):
            raise RequestError(f"a feature reference must be a string like 'source:feature', got {type(ref).__name__}")
        source_name, _, name = ref.partition(":")
        if source_name not in defs.sources:
            raise UnknownNameError("source", source_name, list(defs.sources))
        source = defs.sources[source_name]
        if not name:
            chosen = source.features
        else:
            known = {f.name: f for f in source.features}
            if name not in known:
                raise UnknownNameError(f"feature of source {source_name!r}:", name, list(known))
            chosen = [known[name]]
        for f in chosen:
            if (source.name, f.name) in out:
                first = via[(source.name, f.name)]
                how = f"twice as {shown(ref)!r}" if first == ref else f"twice, as {shown(first)!r} and as {shown(ref)!r}"
                raise RequestError(f"feature '{source.name}:{f.name}' is asked for {how}: ask for each once")
            out[(source.name, f.name)], via[(source.name, f.name)] = (source, f), ref
    return list(out.values())


def _part(entity: EntityDef, key: str, kind: str, value: Any, row: int) -> Any:
    if kind == "int" and type(value) is int and -(2**63) <= value < 2**63:  # the common case, before the general checks
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            # a list or object is named, not shown: its text may nest past Python's recursion limit
            got = type(value).__name__ + ("" if isinstance(value, (list, dict)) else f" {str(value)[:40]!r}")
            raise EntityKeyError(f"entity key {key!r} row {row}: expected an integer, got {got}")
        if not -(2**63) <= int(value) < 2**63:
            raise EntityKeyError(f"entity key {key!r} row {row}: {shown(str(value), 40)} is outside int64")
        return int(value)
    if not isinstance(value, str):
        raise EntityKeyError(f"entity key {key!r} row {row}: expected a string, got {type(value).__name__}")
    if _BAD_STRING_PART.search(value):
        raise EntityKeyError(f"entity key {key!r} row {row}: a key part holds no ':' or control characters (nor lone surrogates)")
    return value


@dataclass(frozen=True)
class Selection:
    """What a request's feature references resolve to (kept per reader: models repeat them)."""

    columns: list[Column]
    sources: dict[str, SourceDef]
    entities: dict[str, EntityDef]
    needed: dict[str, str]
    """The entity key columns these features need, with their types."""
    groups: dict[str, tuple[list[int], list[str]]]
    names: list[str]
    asked: dict[str, list[FeatureDef]]
    """Per source, the features asked for, in request order."""
    fields: dict[str, tuple[str, ...]]
    """Per source, the names of the features asked for (a read's identity without the cache)."""


class ReadRequest:
    """A checked request: its selection (kept between requests) and its entities."""

    __slots__ = ("selection", "join_keys", "ids", "rows", "max_age_seconds")

    def __init__(
        self, selection: Selection, join_keys: dict[str, list], ids: dict[str, list[str]], rows: int, max_age_seconds: float | None = None
    ):
        self.selection = selection
        self.join_keys = join_keys
        """The request's entity columns, in its order (the response repeats them first)."""
        self.ids = ids
        """Entity ids (the key parts joined as the writers join them) per entity type, in row order."""
        self.rows = rows
        self.max_age_seconds = max_age_seconds
        """The request's own max_age: the smaller of it and a source's applies."""

    columns = property(lambda self: self.selection.columns)
    sources = property(lambda self: self.selection.sources)
    groups = property(lambda self: self.selection.groups)
    names = property(lambda self: self.selection.names)
    asked = property(lambda self: self.selection.asked)
    fields = property(lambda self: self.selection.fields)


def select(defs: Definitions, features: list[str] | None, feature_service: str | None, full_feature_names: bool) -> Selection:
    pairs = resolve_features(defs, features, feature_service)
    sep = "__"
    columns = [Column(s, f, f"{s.name}{sep}{f.name}" if full_feature_names else f.name) for s, f in pairs]
    names = [c.name for c in columns]
    if len(set(names)) < len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise RequestError(f"features {', '.join(twice)} come from several sources: ask with full_feature_names")
    involved = {s.entity: defs.entities[s.entity] for s, _ in pairs}
    needed = {k.name: k.type for e in involved.values() for k in e.keys}
    groups: dict[str, tuple[list[int], list[str]]] = {}
    for at, c in enumerate(columns):
        positions, feats = groups.setdefault(c.source.name, ([], []))
        positions.append(at)
        feats.append(c.feature.name)
    asked: dict[str, list[FeatureDef]] = {}
    for c in columns:
        asked.setdefault(c.source.name, []).append(c.feature)
    fields = {name: tuple(f.name for f in feats) for name, feats in asked.items()}
    return Selection(columns, {s.name: s for s, _ in pairs}, involved, needed, groups, names, asked, fields)


class SelectionMemo(BoundedMemo):
    """Resolved feature references kept between requests (models repeat a few lists)."""

    PER_COLUMN = 400
    """Bytes a resolved column costs beyond its reference: the column, its name, its places in the selection."""

    def __init__(self, max_entries: int = 512, max_bytes: int = 16 << 20):
        super().__init__(max_entries, max_bytes)

    def keep(self, key: tuple, selection: Selection) -> None:
        refs = key[0] if isinstance(key[0], tuple) else ()
        super().keep(key, selection, names_bytes(refs) + self.PER_COLUMN * len(selection.columns) + 200)


def _selection(defs: Definitions, features, feature_service, full_feature_names, memo: SelectionMemo | None) -> Selection:
    if memo is None:
        return select(defs, features, feature_service, full_feature_names)
    try:
        key = (tuple(features) if isinstance(features, list) else features, feature_service, bool(full_feature_names))
        got = memo.get(key)
    except TypeError:  # unhashable references: refused by select() below
        return select(defs, features, feature_service, full_feature_names)
    if got is None:
        got = select(defs, features, feature_service, full_feature_names)
        memo.keep(key, got)
    return got


def key_column(entity: EntityDef, key: str, kind: str, values: list) -> list:
    """A key column's values, checked (ints: within int64; strings: no ':' or control characters)."""
    if kind == "int" and all(type(v) is int for v in values) and -(2**63) <= min(values) and max(values) < 2**63:
        return values  # the common case, checked at once
    return [_part(entity, key, kind, v, i) for i, v in enumerate(values)]


def check_key_bytes(entity: EntityDef, ids: list[str], limit: int) -> None:
    for row, eid in enumerate(ids):
        size = len(eid.encode("utf-8"))
        if size > limit:
            raise EntityKeyError(
                f"entity {entity.name!r} row {row}: its key is {size:,} bytes; the limit is {limit:,} (reader.max_key_bytes)"
            )


def parse_request(
    defs: Definitions,
    entities: dict[str, list],
    features: list[str] | None = None,
    *,
    feature_service: str | None = None,
    full_feature_names: bool = False,
    max_entities: int = 1000,
    max_age_seconds: float | None = None,
    memo: SelectionMemo | None = None,
    max_features: int = 1000,
    max_key_bytes: int = 1024,
) -> ReadRequest:
    """Check a request against the definitions; every problem is a RequestError naming the
    bad part. ``memo`` keeps resolved feature references between calls."""
    if isinstance(features, list) and len(features) > max_features:  # before anything is made of them
        raise RequestError(f"{len(features):,} feature references in one request; the limit is {max_features:,} (reader.max_features)")
    selection = _selection(defs, features, feature_service, full_feature_names, memo)
    if not isinstance(entities, dict) or not entities:
        raise EntityKeyError('entities must be a non-empty object of key columns, e.g. {"consumer_id": [1, 2]}')
    involved, needed = selection.entities, selection.needed
    if entities.keys() != needed.keys():
        unknown = [k for k in entities if k not in needed]
        missing = [k for k in needed if k not in entities]
        unknown_shown = ", ".join(repr(shown(k)) for k in unknown[:5]) + " ..." * (len(unknown) > 5)
        parts = ([f"unknown entity key(s) {unknown_shown}"] if unknown else []) + (
            [f"missing {', '.join(map(repr, missing))}"] if missing else []
        )
        raise EntityKeyError(f"{'; '.join(parts)}: these features need the key column(s) {', '.join(map(repr, needed))}")
    lengths = {k: len(v) if isinstance(v, list) else -1 for k, v in entities.items()}
    if any(n < 0 for n in lengths.values()):
        bad = next(k for k, n in lengths.items() if n < 0)
        raise EntityKeyError(f"entity key {bad!r}: expected a list of values")
    rows = next(iter(lengths.values()))
    if any(n != rows for n in lengths.values()):
        raise EntityKeyError(f"entity key columns differ in length: {', '.join(f'{k} {n}' for k, n in lengths.items())}")
    if rows == 0:
        raise EntityKeyError("no entities: the key columns are empty")
    if rows > max_entities:
        raise RequestError(f"{rows:,} entities in one request; the limit is {max_entities:,} (reader.max_entities)")
    ids: dict[str, list[str]] = {}
    for entity in involved.values():
        cols = [key_column(entity, k.name, k.type, entities[k.name]) for k in entity.keys]
        ids[entity.name] = got = [entity_id(*parts) for parts in zip(*cols)] if len(cols) > 1 else [str(v) for v in cols[0]]
        # one int key: at most 20 characters (max_key_bytes is at least 64); a character is at most 4 bytes: only a long id is measured
        if (len(entity.keys) > 1 or entity.keys[0].type != "int") and max(map(len, got)) * 4 > max_key_bytes:
            check_key_bytes(entity, got, max_key_bytes)
    if max_age_seconds is not None and (
        not isinstance(max_age_seconds, (int, float)) or isinstance(max_age_seconds, bool) or max_age_seconds <= 0
    ):
        raise RequestError("max_age must be a positive number of seconds")
    return ReadRequest(selection, {k: list(entities[k]) for k in entities}, ids, rows, max_age_seconds)
