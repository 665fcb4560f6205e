"""A push's rows, checked and typed: the Arrow batches the nightly run's writers take.

Every value is checked as the run checks it (the type, an embedding's dimension, a list
element that is null or not finite, a string past ``max_length``, JSON the type refuses);
the first bad one refuses the whole push with a line naming its row and column, before
anything is written. Of several rows of one entity, the latest by event time (then created
time, then the later row of the request) is written, as the run keeps one row per entity.
"""

from __future__ import annotations

import datetime as dt
import math
import numbers
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa

from feature_defs import EntityDef, FeatureDef, SourceDef
from feature_push.errors import PushError
from feature_reader.errors import EntityKeyError
from feature_reader.request import check_key_bytes, key_column
from serializers.batch import AS_OF_US, feature_specs
from serializers.errors import BadValue
from serializers.json_map import encode_json_maps
from serializers.json_value import canonical, canonical_value, parse_text
from serializers.keys import entity_id

ID, AS_OF, JSON_MAP, NON_FINITE = "_id", "_as_of", "_features_json", "_non_finite"
"""The columns the writers read beside the features (jobs/transforms.py names them alike)."""
EVENT_TIMESTAMP, CREATED = "event_timestamp", "created"
"""The time columns Feast's remote online store sends, whatever the source calls its own."""
_FLOAT32_LIMIT = 2.0**128 - 2.0**103
"""Where float32 rounding turns infinite: below it a value rounds to a finite float32 (its
largest, 3.4028235e38 as written, included), from it on to infinity."""
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_SECONDS = (-62_135_596_800, 253_402_300_800)
"""Epoch seconds of datetime's years 1 to 9999: a time outside is refused."""
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
"""An escaped NUL in JSON text (``\u0000`` after an even number of backslashes)."""


@dataclass(frozen=True)
class Pushed:
    """One source's rows of a push, ready for its writers."""

    source: SourceDef
    entity: EntityDef
    redis: pa.RecordBatch
    """_id, the features in definition order, _as_of (event time, UTC epoch seconds, floored),
    _as_of_us (the same in microseconds)."""
    ids: list[str]
    rows: int
    """Rows of the request (``len(ids)`` entities after the latest per entity)."""

    def sql(self, max_map_bytes: int) -> pa.RecordBatch:
        """_id, the JSON object of the SQL store, its omitted NaN/inf count, _as_of; PushError
        for an object past ``sql.max_map_bytes`` or a NUL PostgreSQL's JSONB cannot hold."""
        maps, dropped = encode_json_maps(self.redis, feature_specs(self.source.features))
        for i, text in enumerate(maps.to_pylist()):
            if len(text.encode("utf-8")) > max_map_bytes:
                raise PushError(f"entity {self.ids[i]!r}: its features' JSON is larger than {max_map_bytes:,} bytes (sql.max_map_bytes)")
            if _NUL.search(text):
                raise PushError(f"entity {self.ids[i]!r}: a NUL character (not storable in the SQL store's JSONB)")
        return pa.RecordBatch.from_arrays(
            [self.redis.column(ID), maps, pa.array(dropped, pa.int32()), self.redis.column(AS_OF), self.redis.column(AS_OF_US)],
            names=[ID, JSON_MAP, NON_FINITE, AS_OF, AS_OF_US],
        )


def arrow_type(feature: FeatureDef) -> pa.DataType:
    """The Arrow type the writers' encoders take for a feature (what the run casts it to)."""
    f64 = pa.float32() if feature.precision == "float32" else pa.float64()
    return {
        "float": f64,
        "int": pa.int64(),
        "bool": pa.bool_(),
        "string": pa.string(),
        "embedding": pa.list_(pa.float32()),
        "int_list": pa.list_(pa.int64()),
        "string_list": pa.list_(pa.string()),
        "float_list": pa.list_(f64),
        "json": pa.string(),  # canonical JSON text
    }[feature.type]


def pushed_rows(
    source: SourceDef,
    entity: EntityDef,
    df: Mapping[str, Any],
    *,
    max_key_bytes: int = 1024,
    now: float | None = None,
    skew_seconds: float = 300.0,
    others: frozenset[str] = frozenset(),
) -> Pushed:
    """Check a push body's ``df`` (column -> values) against ``source``; PushError naming the
    first bad row and column. Event times are no later than ``now`` (the clock) plus
    ``skew_seconds``, and none already expired by the entity's TTL. ``others``: columns of the other sources the same push writes
    (one push source read by several), which this one leaves to them."""
    rows = df_rows(df)
    columns = _columns(source, entity, df, others)
    keys = columns["keys"]  # in the entity's key order
    try:
        parts = [key_column(entity, name, k.type, list(df[name])) for name, k in zip(keys, entity.keys)]
        ids = [entity_id(*p) for p in zip(*parts)] if rows else []
        check_key_bytes(entity, ids, max_key_bytes)
    except EntityKeyError as exc:
        raise PushError(str(exc), 400, "BadPushKey") from None
    micros = _times(df[columns["event"]], columns["event"], required=True)
    _check_times(micros, columns["event"], entity, time.time() if now is None else now, skew_seconds)
    times = [t // 1_000_000 for t in micros]  # whole seconds, floored: what the stores hold and compare
    created = _times(df[columns["created"]], columns["created"], required=False) if columns["created"] else [None] * rows
    for row, t in enumerate(created):
        if t is not None:
            _not_ancient(row, columns["created"], t)
    keep = _latest(ids, micros, created)  # to the microsecond, as a run orders an entity's rows
    if source.on_tie == "fail":
        _check_ties(source, df, columns, ids, micros, created)
    arrays = [pa.array([ids[i] for i in keep], pa.string())]
    for feature in source.features:
        name = columns["features"].get(feature.name)
        values = list(df[name]) if name is not None else [None] * rows
        arrays.append(_typed(feature, name or feature.name, values, keep))
    arrays.append(pa.array([times[i] for i in keep], pa.int64()))
    arrays.append(pa.array([micros[i] for i in keep], pa.int64()))  # the stores order writes to the microsecond
    batch = pa.RecordBatch.from_arrays(arrays, names=[ID, *[f.name for f in source.features], AS_OF, AS_OF_US])
    return Pushed(source, entity, batch, [ids[i] for i in keep], rows)


def df_rows(df: Any) -> int:
    """The rows of a push body's ``df``: an object of columns, each a list, all one length, at
    least one row; PushError naming the column otherwise (nothing of a malformed push is taken)."""
    if not isinstance(df, Mapping) or not df:
        raise PushError("'df' must be an object of columns: {column: [values, ...]}")
    lengths = {}
    for name, values in df.items():
        if isinstance(values, Mapping):
            raise PushError(
                f"column {_cut(name)!r} is an object (row label -> value, pandas' DataFrame.to_dict() default): "
                "each column must be a list of values, as DataFrame.to_dict(orient='list') gives"
            )
        if not isinstance(values, list):
            raise PushError(f"column {_cut(name)!r}: expected a list of values, got {type(values).__name__}")
        lengths[name] = len(values)
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{_cut(n)!r}: {n_:,}" for n, n_ in list(lengths.items())[:5])
        raise PushError(f"the columns of 'df' differ in length ({shown})")
    rows = next(iter(lengths.values()))
    if rows == 0:
        raise PushError("'df' holds no rows: a push writes at least one")
    return rows


def _key_names(source: SourceDef, entity: EntityDef, df: Mapping[str, Any]) -> list[str]:
    """Per entity key, the column of ``df`` holding it: the source's key column (``key_columns``),
    or the entity key's own name (what Feast's SDK sends for a view whose source maps join keys)."""
    out, missing = [], []
    for i, key in enumerate(entity.keys):
        names = list(dict.fromkeys((source.key_columns[i] if source.key_columns else key.name, key.name)))
        found = [n for n in names if n in df]
        if len(found) > 1:
            raise PushError(f"entity key {key.name!r} is given twice, as {found[0]!r} and as {found[1]!r}")
        if not found:
            missing.append(names[0])
        out.append(found[0] if found else names[0])
    if missing:
        keyed = source.key_columns or [k.name for k in entity.keys]
        raise PushError(f"missing entity key column(s) {', '.join(map(repr, missing))} (source {source.name!r} is keyed by {keyed})")
    return out


def source_columns(source: SourceDef, entity: EntityDef) -> frozenset[str]:
    """Every column name a push to ``source`` may carry (keys, times, features by name or source column)."""
    names = {*(source.key_columns or []), *(k.name for k in entity.keys), EVENT_TIMESTAMP, CREATED}
    names |= {c for c in (source.timestamp_column, source.created_column) if c}
    names |= {c for f in source.features for c in (f.name, f.source_column) if c}
    return frozenset(names)


def _columns(source: SourceDef, entity: EntityDef, df: Mapping[str, Any], others: frozenset[str]) -> dict:
    """Which column of ``df`` is which: keys, event time, created time, features (by name or
    source column). A column that is none of these (nor in ``others``), or a missing key,
    refuses the push."""
    keys = _key_names(source, entity, df)
    event = next((c for c in (source.timestamp_column, EVENT_TIMESTAMP) if c and c in df), None)
    if event is None:
        raise PushError(f"missing the event time column {source.timestamp_column!r}: each pushed row needs its event time")
    created = next((c for c in (source.created_column, CREATED) if c and c in df), None)
    features: dict[str, str] = {}
    for f in source.features:
        found = [c for c in dict.fromkeys((f.name, f.source_column)) if c in df]
        if len(found) > 1:
            raise PushError(f"feature {f.name!r} is given twice, as {found[0]!r} and as {found[1]!r}")
        if found:
            features[f.name] = found[0]
    known = {*keys, event, *([created] if created else []), *features.values(), EVENT_TIMESTAMP, CREATED}
    unknown = [c for c in df if c not in known and c not in others]
    if unknown:
        shown = ", ".join(repr(_cut(c)) for c in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise PushError(f"unknown column(s) {shown}: source {source.name!r} has no such feature, key or time column")
    if not features:
        raise PushError(f"no feature of source {source.name!r} in 'df' (its features: {', '.join(f.name for f in source.features)})")
    return {"keys": keys, "event": event, "created": created, "features": features}


def _check_times(micros: list[int], column: str, entity: EntityDef, now: float, skew: float) -> None:
    """Feast's pushes are "now": a time later than the clock (plus the skew clocks may differ
    by) would hold the entity against the nightly runs until it comes; one older than the
    entity's TTL would be kept alive by the push's expiry, served PRESENT though expired."""
    latest = math.floor((now + skew) * 1_000_000)
    oldest = math.ceil((now - entity.ttl_seconds) * 1_000_000) if entity.ttl_seconds else None
    for row, t in enumerate(micros):
        _not_ancient(row, column, t)
        if t > latest:
            raise PushError(
                f"row {row}, column {column!r}: event time {_utc(t)} is later than now ({_utc(float(now))}) plus "
                f"{skew:g} s (server.push.clock_skew_seconds): a pushed row is what is true now, not later"
            )
        if oldest is not None and t < oldest:
            raise PushError(
                f"row {row}, column {column!r}: event time {_utc(t)} is older than entity {entity.name!r}'s TTL "
                f"({entity.ttl_seconds:,} s, ttl_seconds): expired already, it would be served as fresh"
            )


_EARLIEST = (dt.datetime(1900, 1, 1, tzinfo=dt.UTC) - _EPOCH) // dt.timedelta(microseconds=1)
"""Spark reads an earlier time of a Parquet file ambiguously (the calendar's rebase) and refuses
the whole file: a pushed row that early, appended, would fail every run of the source."""


def _not_ancient(row: int, column: str, micros: int) -> None:
    if micros < _EARLIEST:
        raise PushError(f"row {row}, column {column!r}: {_utc(micros)} is before 1900-01-01, which no run of the source reads")


def _times(values: Sequence[Any], column: str, required: bool) -> list[int | None]:
    """UTC epoch microseconds: ISO 8601 text (no offset: UTC) or epoch seconds."""
    out: list[int | None] = []
    for row, v in enumerate(values):
        if v is None:
            if required:
                raise PushError(f"row {row}, column {column!r}: the event time is null")
            out.append(None)
        elif isinstance(v, str):
            try:
                t = dt.datetime.fromisoformat(v)
            except ValueError:
                raise PushError(f"row {row}, column {column!r}: {_cut(v)!r} is not an ISO 8601 time") from None
            t = t if t.tzinfo else t.replace(tzinfo=dt.UTC)
            try:
                out.append((t - _EPOCH) // dt.timedelta(microseconds=1))
            except OverflowError:  # an offset carries it past year 1 or 9999, UTC
                raise PushError(f"row {row}, column {column!r}: {_cut(v)!r} is outside the years 1 to 9999, UTC") from None
        elif isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and _SECONDS[0] <= v < _SECONDS[1]:
            out.append(v * 1_000_000 if isinstance(v, int) else math.floor(Decimal(repr(float(v))) * 1_000_000))
        else:
            raise PushError(f"row {row}, column {column!r}: expected an ISO 8601 time or epoch seconds, got {type(v).__name__}")
    return out


def _check_ties(source: SourceDef, df: Mapping[str, Any], columns: dict, ids: list[str], micros: list[int], created: list) -> None:
    """Two rows of one entity as recent as each other (event and created time) with different
    values are a tie, which the run refuses for the whole source (on_tie: fail): refused here,
    so no push puts one in the table or leaves the stores to pick."""
    seen: dict[tuple, int] = {}
    names = list(columns["features"].values())
    for row, eid in enumerate(ids):
        first = seen.setdefault((eid, micros[row], created[row]), row)
        if first != row and any(df[c][first] != df[c][row] for c in names):
            raise PushError(
                f"rows {first} and {row} of entity {eid!r} have the same event time{' and created time' * (created[row] is not None)} "
                f"and different values: a tie, which a run of source {source.name!r} refuses (on_tie: fail); push one of them"
            )


def _latest(ids: list[str], times: list[int], created: list[int | None]) -> list[int]:
    """Row indexes to write: per entity, the latest (event time, then created time, a row without
    one losing, then the later row), sorted by entity id (the SQL writer takes rows sorted by key)."""

    def rank(i: int) -> tuple:
        return (times[i], created[i] is not None, created[i] or 0)

    best: dict[str, int] = {}
    for i, eid in enumerate(ids):
        j = best.get(eid)
        if j is None or rank(i) >= rank(j):
            best[eid] = i
    return sorted(best.values(), key=ids.__getitem__)


def _typed(feature: FeatureDef, column: str, values: list, keep: list[int]) -> pa.Array:
    """The ``keep`` rows' values as the writers take them; every row checked, kept or not (an
    offline push appends them all, and a run may find an older one its latest)."""
    check = _CHECKS[feature.type]
    typed: list = [None] * len(values)
    for row, v in enumerate(values):
        if v is None:
            continue
        try:
            typed[row] = check(feature, v)
        except _Bad as exc:
            raise PushError(f"row {row}, column {column!r}: {exc} (feature {feature.name!r} is {feature.type})") from None
    return pa.array([typed[row] for row in keep], arrow_type(feature))


class _Bad(Exception):
    pass


def _number(v: Any, float32: bool) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise _Bad(f"expected a number, got {_shown(v)}")
    try:
        x = float(v)
    except OverflowError:  # an integer past float64's range
        raise _Bad(f"{_cut(str(v), 40)} is beyond float64 range") from None
    if not math.isfinite(x):
        raise _Bad("NaN and infinities are not stored")
    if float32 and abs(x) >= _FLOAT32_LIMIT:
        raise _Bad(f"{x!r} is beyond float32 range")
    return x


def _integer(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise _Bad(f"expected an integer, got {_shown(v)}")
    if not -(2**63) <= int(v) < 2**63:
        raise _Bad("outside int64")
    return int(v)


def _elements(v: Any, element) -> list:
    if not isinstance(v, list):
        raise _Bad(f"expected a list, got {_shown(v)}")
    out = []
    for i, e in enumerate(v):
        if e is None:
            raise _Bad(f"element {i} is null")
        try:
            out.append(element(e))
        except _Bad as exc:
            raise _Bad(f"element {i}: {exc}") from None
    return out


def _float(f: FeatureDef, v: Any) -> float:
    return _number(v, f.precision == "float32")


def _int(f: FeatureDef, v: Any) -> int:
    return _integer(v)


def _bool(f: FeatureDef, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _Bad(f"expected true or false, got {_shown(v)}")
    return v


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise _Bad(f"expected a string, got {_shown(v)}")
    return v


def _string(f: FeatureDef, v: Any) -> str:
    text = _text(v)
    if f.max_length and len(text) > f.max_length:
        raise _Bad(f"longer than {f.max_length} characters")
    return text


def _embedding(f: FeatureDef, v: Any) -> list[float]:
    out = _elements(v, lambda e: _number(e, True))
    if f.dimension and len(out) != f.dimension:
        raise _Bad(f"{len(out)} elements; the embedding's dimension is {f.dimension}")
    return out


def _int_list(f: FeatureDef, v: Any) -> list[int]:
    return _elements(v, _integer)


def _string_list(f: FeatureDef, v: Any) -> list[str]:
    return _elements(v, _text)


def _float_list(f: FeatureDef, v: Any) -> list[float]:
    return _elements(v, lambda e: _number(e, f.precision == "float32"))


def _json(f: FeatureDef, v: Any) -> str | None:
    """A string is a JSON text (what Feast sends for a Json feature), anything else the value
    itself; with ``json_text_elements``, a list of strings holds each element's JSON text
    (a null element is JSON's null), as the run reads such a column."""
    try:
        texts = f.json_text_elements and isinstance(v, list) and any(isinstance(e, str) for e in v)
        if texts and not all(e is None or isinstance(e, str) for e in v):
            at = next(i for i, e in enumerate(v) if e is not None and not isinstance(e, str))
            raise _Bad(f"element {at} is a JSON value among JSON texts: with json_text_elements every element is a JSON text or null")
        if texts:
            made = canonical_value([None if e is None else _element(i, e) for i, e in enumerate(v)], f.options.get("max_bytes"))
            return made.decode("utf-8")
        made = canonical(v, f.options.get("max_bytes"))
        return None if made is None else made.decode("utf-8")
    except BadValue as exc:
        raise _Bad(str(exc)) from None
    except RecursionError:
        raise _Bad("nested too deeply") from None


def _element(i: int, text: str) -> Any:
    try:
        return parse_text(text)
    except BadValue as exc:
        raise _Bad(f"element {i}: {exc}") from None


_CHECKS = {
    "float": _float,
    "int": _int,
    "bool": _bool,
    "string": _string,
    "embedding": _embedding,
    "int_list": _int_list,
    "string_list": _string_list,
    "float_list": _float_list,
    "json": _json,
}


def _shown(v: Any) -> str:
    if isinstance(v, (list, dict)):
        return type(v).__name__
    return f"{type(v).__name__} {_cut(repr(v), 40)}"


def _cut(text: Any, n: int = 80) -> str:
    text = str(text)
    return text if len(text) <= n else text[:n] + "..."


def _utc(micros: float) -> str:
    """Epoch microseconds (or seconds, a float) as ISO 8601 UTC."""
    try:
        when = _EPOCH + (dt.timedelta(seconds=micros) if isinstance(micros, float) else dt.timedelta(microseconds=micros))
    except OverflowError:
        return f"{micros} {'s' if isinstance(micros, float) else 'microseconds'} from the epoch"
    return when.isoformat(timespec="microseconds" if when.microsecond else "seconds").replace("+00:00", "Z")
