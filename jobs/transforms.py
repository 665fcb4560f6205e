"""Pure DataFrame-in/DataFrame-out steps from a source snapshot to encode-ready rows.

snapshot -> check_schema -> tag_key_problems -> latest rows -> (pivot long rows)
-> tag_value_problems -> with_entity_id. Rows with problems carry ``_reasons``
(a non-empty array of strings) and go to quarantine; nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from feature_defs import EntityDef, FeatureDef, SourceDef
from jobs import json_values
from jobs.source_errors import SchemaDriftError
from jobs.sql_text import ident, literal
from serializers.batch import AS_OF_US, FeatureSpec
from serializers.batch import feature_specs as specs_of
from serializers.json_map import encode_json_maps
from serializers.keys import KEY_SEPARATOR

REASONS = "_reasons"
ENTITY_ID = "_id"
JSON_MAP = "_features_json"
"""The SQL store's JSON object of the row's features (null on rows already bad)."""
NON_FINITE = "_non_finite"
"""NaN/inf float values the JSON object leaves out."""
AS_OF = "_as_of"
"""Range runs: the as-of time (epoch seconds) of the date each row comes from."""
CONFLICTS = "_conflicts"
"""Other versions of the entity as recent as the one kept (see latest_per_key)."""

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
_NUMERIC = (*_INTEGRAL, T.FloatType, T.DoubleType, T.DecimalType)
_TIMES = (T.TimestampType, T.TimestampNTZType, T.DateType)

# Long layout text values. Numbers: ASCII digits, optional fraction and exponent (Spark's own
# cast would also take "1d", "0x1p3", Unicode digits). NaN/inf only spelled out.
_NUMBER_TEXT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"
_SPELLED = (
    (float("nan"), ("nan", "+nan", "-nan")),
    (float("inf"), ("inf", "+inf", "infinity", "+infinity")),
    (float("-inf"), ("-inf", "-infinity")),
)
_TRUE_TEXT = ("true", "1", "1.0")
_FALSE_TEXT = ("false", "0", "0.0")
_INT64_END = 2.0**63  # a double cast to long saturates here instead of failing
_CONTROL = literal(r"[\x00-\x1f\x7f]")  # a control character, as a SQL regex literal


def col(name: str) -> Column:
    """The column named ``name``, whatever its characters: ``F.col("a.b")`` reads a field b of
    a struct a, and a name with a space or a backtick is no column at all. Every name from a
    table or a definition is taken through here (or :func:`ident` in SQL text)."""
    return F.col(ident(name))


def spark_type(feature: FeatureDef) -> T.DataType:
    """The Spark type a feature is cast to before encoding."""
    return {
        "float": T.FloatType() if feature.precision == "float32" else T.DoubleType(),
        "int": T.LongType(),
        "bool": T.BooleanType(),
        "string": T.StringType(),
        "embedding": T.ArrayType(T.FloatType()),
        "int_list": T.ArrayType(T.LongType()),
        "string_list": T.ArrayType(T.StringType()),
        "float_list": T.ArrayType(T.FloatType() if feature.precision == "float32" else T.DoubleType()),
        "json": T.StringType(),  # canonical JSON text, whatever the source column held (jobs/json_values.py)
    }[feature.type]


def _accepts(feature_type: str, found: T.DataType) -> bool:
    if feature_type == "float":
        return isinstance(found, _NUMERIC)
    if feature_type == "int":  # a time: its epoch seconds (epoch_seconds_sql)
        return isinstance(found, (*_INTEGRAL, *_TIMES))
    if feature_type == "bool":
        return isinstance(found, T.BooleanType)
    if feature_type == "string":  # a decimal: its exact text (decimal_text_sql)
        return isinstance(found, (T.StringType, T.DecimalType))
    if not isinstance(found, T.ArrayType):
        return False
    element = found.elementType
    return {
        "embedding": isinstance(element, (T.FloatType, T.DoubleType)),
        "int_list": isinstance(element, _INTEGRAL),
        "string_list": isinstance(element, (T.StringType, T.DecimalType)),  # a decimal: its exact text
        "float_list": isinstance(element, (T.FloatType, T.DoubleType, *_INTEGRAL)),
    }[feature_type]


def epoch_seconds_sql(column: str, found: T.DataType) -> str:
    """SQL for the whole UTC epoch seconds, floored, of ``column`` (a timestamp, timestamp_ntz or
    date: the last two read as UTC, the session's time zone): what an ``int`` feature reads from
    a time column, as Feast stores a UnixTimestamp feature and as the event time is stored."""
    return f"unix_seconds({column})" if isinstance(found, T.TimestampType) else f"unix_seconds(CAST({column} AS TIMESTAMP))"


def decimal_text_sql(column: str, found: T.DecimalType) -> str:
    """SQL for the exact text of a decimal, as Python's ``str(Decimal)`` and Java's
    ``BigDecimal.toString`` write it (what Feast stores for a Decimal feature): plain, with every
    digit of the scale, unless the value is below 1E-6 in magnitude, then in scientific notation
    (``1.000E-7``, ``0E-10``). Spark's own cast always writes it plain."""
    plain = f"CAST({column} AS STRING)"
    if found.scale == 0:
        return plain
    digits = f"coalesce(nullif(regexp_replace(replace(CAST(abs({column}) AS STRING), '.', ''), '^0+', ''), ''), '0')"
    adjusted = f"(length({digits}) - 1 - {found.scale})"
    scientific = (
        f"concat(if({column} < 0, '-', ''), substr({digits}, 1, 1), if(length({digits}) > 1, concat('.', substr({digits}, 2)), ''), "
        f"'E', CAST({adjusted} AS STRING))"
    )
    return f"CASE WHEN {column} IS NULL THEN NULL WHEN {adjusted} >= -6 THEN {plain} ELSE {scientific} END"


def key_columns(source: SourceDef, entity: EntityDef) -> list[str]:
    return source.key_columns or [k.name for k in entity.keys]


def check_schema(df: DataFrame, source: SourceDef, entity: EntityDef, where: str | None = None) -> None:
    """Fail before anything is written when the table does not match the definition: one line
    per problem, each naming the source (and ``where``, its table) and the column."""
    problems = schema_problems(df.schema, source, entity)
    if problems:
        at = f" ({where})" if where else ""
        raise SchemaDriftError("\n".join(f"source {source.name!r}{at} does not match its definition: {p}" for p in problems))


def schema_problems(schema: T.StructType, source: SourceDef, entity: EntityDef) -> list[str]:
    """What in a table's schema does not match the source's definition (none: it matches)."""
    fields = {f.name: f.dataType for f in schema.fields}
    problems = []

    def need(column: str | None, ok, expected: str) -> None:
        if column is None:
            return
        if column not in fields:
            problems.append(f"column {column!r} is missing (expected {expected})")
        elif not ok(fields[column]):
            problems.append(f"column {column!r} has type {fields[column].simpleString()}, expected {expected}")

    for column, key in zip(key_columns(source, entity), entity.keys):
        if key.type == "int":
            need(column, lambda t: isinstance(t, _INTEGRAL), "an integer key")
        else:
            need(column, lambda t: isinstance(t, T.StringType), "a string key")
    if source.by_event_time:  # an epoch number would leave its unit (seconds? milliseconds?) to a guess
        need(
            source.timestamp_column, lambda t: isinstance(t, (T.TimestampType, T.TimestampNTZType, T.DateType)), "an event time (timestamp)"
        )
        need(source.created_column, lambda t: isinstance(t, (T.TimestampType, T.TimestampNTZType, T.DateType, *_NUMERIC)), "a timestamp")
    else:
        need(source.timestamp_column, lambda t: isinstance(t, (T.TimestampType, T.TimestampNTZType, T.DateType, *_NUMERIC)), "a timestamp")
        problems += [p for p in [date_problem(schema, source.date_column)] if p]
    if source.layout == "wide":
        for f in source.features:
            if f.type == "json":
                problem = json_values.json_column_problem(fields[f.source_column]) if f.source_column in fields else None
                need(f.source_column, lambda t: True, json_values.EXPECTED)
                if problem:
                    problems.append(f"column {f.source_column!r} {problem}")
                continue
            need(f.source_column, lambda t, f=f: _accepts(f.type, t), f"{f.type} ({spark_type(f).simpleString()})")
    else:
        need(source.name_column, lambda t: isinstance(t, T.StringType), "a string feature name")
        need(source.value_column, lambda t: isinstance(t, (*_NUMERIC, T.StringType, T.BooleanType)), "a numeric or string value")
        value_type = fields.get(source.value_column)
        if any(f.type == "json" for f in source.features) and value_type is not None and not isinstance(value_type, T.StringType):
            problems.append(
                f"column {source.value_column!r} has type {value_type.simpleString()}: json features of a long layout need "
                "a string value column (JSON text)"
            )
        bad = [f.name for f in source.features if f.type not in ("float", "int", "bool", "string", "json")]
        if bad:
            problems.append(f"features {bad} have list/embedding types, which a long layout cannot carry")
    return problems


def date_problem(schema: T.StructType, column: str) -> str | None:
    """Why ``column`` cannot be a source's date column (a date, or yyyy-MM-dd text as Hive
    tables are often partitioned by), or None."""
    found = {f.name: f.dataType for f in schema.fields}.get(column)
    expected = "expected the date column: a date, or yyyy-MM-dd text"
    if found is None:
        return f"column {column!r} is missing ({expected})"
    if not isinstance(found, (T.DateType, T.StringType)):
        return f"column {column!r} has type {found.simpleString()}, {expected}"
    return None


def _reason(condition: Column | str, text: str) -> Column:
    """``text`` where ``condition`` holds, else null. A condition given as SQL text costs one
    call to the JVM, where a Column costs one per operator (jobs/sql_text.py)."""
    if isinstance(condition, str):
        return F.expr(f"CASE WHEN {condition} THEN {literal(text)} END")
    return F.when(condition, F.lit(text))


def collect_reasons(df: DataFrame, reasons: list[Column]) -> DataFrame:
    """Add ``reasons`` (columns: text or null) to the row's ``_reasons``."""
    none = F.array().cast("array<string>")
    tagged = none
    if reasons:
        # Only a row with a problem builds the array: filter() runs its lambda interpreted,
        # and ran on every row (a third of computing a 1M-entity snapshot, bench/stage_profile.py).
        # "Any reason" is one flat coalesce: OR-ing them nested two per reason and feature, and
        # a source of 200 float features overflowed the JVM's stack converting the tree.
        problem = F.coalesce(*reasons).isNotNull() if len(reasons) > 1 else reasons[0].isNotNull()
        tagged = F.when(problem, F.filter(F.array(*reasons), lambda r: r.isNotNull())).otherwise(none)
    if REASONS in df.columns:
        tagged = F.concat(F.col(REASONS), tagged)
    return df.withColumn(REASONS, tagged)


def tag_key_problems(df: DataFrame, source: SourceDef, entity: EntityDef) -> DataFrame:
    """Add ``_reasons`` for rows whose entity key cannot be written."""
    reasons = []
    for column, key in zip(key_columns(source, entity), entity.keys):
        c = ident(column)
        reasons.append(_reason(f"{c} IS NULL", f"null key {column}"))
        if key.type == "string":
            reasons.append(_reason(f"{c} = ''", f"empty key {column}"))
            reasons.append(_reason(f"contains({c}, ':')", f"key {column} contains ':'"))
            reasons.append(_reason(f"{c} RLIKE {_CONTROL}", f"key {column} contains a control character"))
    return collect_reasons(df, reasons)


def is_bad(df: DataFrame) -> Column:
    return F.size(F.col(REASONS)) > 0


ORDER_HASHES = ("_o1", "_o2")
"""The columns holding a row's two content hashes while its key's rows are ordered."""


def _with_order(df: DataFrame, source: SourceDef, partition: list[str]) -> tuple[DataFrame, list[Column]]:
    """``df`` with the order's content hashes as columns, and the order: latest first, exact ties
    broken by hashes of the whole row so reruns pick the same row. As columns, not expressions:
    Spark computed an expression of a window's order again for every window over it, and sorted
    every row again for each (four sorts of a key's history, one now)."""
    order = [col(source.timestamp_column).desc_nulls_last()] if source.timestamp_column else []
    if source.created_column:  # select_by event_time: of rows of one event time, the latest created (Feast's rule)
        order.append(col(source.created_column).desc_nulls_last())
    # Without the date column: a range run (date in the partition) breaks ties as a run of one date does.
    content = [c for c in df.columns if c not in partition and c not in (REASONS, source.date_column)]
    # Spark hashes no map, even nested (a json feature's column may hold one): its JSON text is hashed instead.
    hashed = [F.to_json(col(c)) if _holds(df.schema[c].dataType, (T.MapType,)) else col(c) for c in content]
    # Spark's hashes skip nulls, so which columns are null is hashed too: (1, null) and
    # (null, 1) differ. Two different rows of a key equal in both hashes: about 2^-96. (The
    # rows' JSON text as the last key, as before, tripled the time of the sort.)
    hashed.append(F.array(*[F.isnull(col(c)) for c in content]))
    first, second = ORDER_HASHES
    staged = df.withColumn(first, F.xxhash64(*hashed)).withColumn(second, F.hash(*hashed))
    return staged, order + [F.col(first).desc(), F.col(second).desc()]


def _holds(t: T.DataType, kinds: tuple[type, ...]) -> bool:
    """Whether a value of type ``t`` is, or nests anywhere, a type of ``kinds``."""
    if isinstance(t, kinds):
        return True
    if isinstance(t, T.ArrayType):
        return _holds(t.elementType, kinds)
    if isinstance(t, T.MapType):
        return _holds(t.keyType, kinds) or _holds(t.valueType, kinds)
    if isinstance(t, T.StructType):
        return any(_holds(f.dataType, kinds) for f in t.fields)
    return False


def _values_hash(df: DataFrame, columns: list[str]) -> Column:
    """A 64-bit hash of the values of ``columns`` that tells apart what the stores would hold
    apart. Spark's hashes skip nulls and take -0.0 for 0.0 (which the format writes apart), so
    which columns are null is hashed too, a zero float adds its sign, and a nested value holding
    floats (or a map, which Spark does not hash) is hashed as its JSON text. (The whole row's
    JSON text, as before, took 3-4 s of the de-duplication of 3,000,000 rows.)"""
    parts = []
    for name in columns:
        c, t = col(name), df.schema[name].dataType
        if isinstance(t, (T.FloatType, T.DoubleType)):
            parts += [c, F.when(c == 0, F.startswith(c.cast("string"), F.lit("-")))]
        elif _holds(t, (T.MapType, T.FloatType, T.DoubleType)):  # Spark hashes no map, even nested
            parts.append(F.to_json(c))
        else:
            parts.append(c)
    return F.xxhash64(*parts, F.array(*[F.isnull(col(name)) for name in columns]))


def latest_per_key(df: DataFrame, source: SourceDef, partition: list[str], unique: bool = False) -> DataFrame:
    """Keep the latest row per ``partition`` key (deterministic on ties).

    ``unique``: the caller counted one row per key; the rows are kept as they are, with
    no conflicts (the window's sort of every row is what de-duplication costs).

    Adds CONFLICTS: how many other rows of the key, as recent as the one kept (same
    timestamp and created time, or no timestamp column), carry different feature values. Copies, and rows
    differing only in columns that are not features, do not count. A key with conflicts
    is not unique after de-duplication: which version is right is unknown.
    """
    if unique:
        return df.withColumn(CONFLICTS, F.lit(0))
    values = [source.value_column] if source.layout == "long" else [f.source_column for f in source.features]
    staged, order = _with_order(df, source, partition)
    keys = [col(p) for p in partition]
    window = Window.partitionBy(*keys).orderBy(*order)
    times = [c for c in (source.timestamp_column, source.created_column) if c]
    tops = [f"_top{i}" for i in range(len(times))]
    # one sort: the rank and the kept row's times over one window, the conflicts over its partition
    ranked = staged.select(
        "*", F.row_number().over(window).alias("_rank"), *[F.first(col(t)).over(window).alias(top) for t, top in zip(times, tops)]
    )
    tied = F.lit(True)
    for t, top in zip(times, tops):  # as recent as the kept row (its time is null only when every row's is)
        tied = tied & col(t).eqNullSafe(F.col(top))
    # Values hashed for the rows tied with the one kept only (it is one of them, so its own
    # hash is in the set): a key's history of many rows costs its sort, not a JSON text per row.
    tied_values = F.when(tied, _values_hash(staged, values))
    conflicts = F.size(F.collect_set(tied_values).over(Window.partitionBy(*keys))) - 1
    return ranked.withColumn(CONFLICTS, conflicts).where("_rank = 1").drop("_rank", *ORDER_HASHES, *tops)


def wide_features(df: DataFrame, source: SourceDef, entity: EntityDef, per_date: bool = False, unique: bool = False) -> DataFrame:
    """Latest row per entity (per entity and date with ``per_date``), features cast to
    their encode types and named by feature. ``unique``: see :func:`latest_per_key`."""
    keys = key_columns(source, entity) + ([source.date_column] if per_date else [])
    latest = latest_per_key(df, source, keys, unique)
    typed, reasons = {}, []
    found = {c.name: c.dataType for c in df.schema.fields}
    for f in source.features:  # SQL text: one JVM call per expression, not one per operator
        raw, type_name = ident(f.source_column), spark_type(f).simpleString()
        if found[f.source_column] == spark_type(f) or f.type == "json":  # json: made canonical text later (tag_value_problems)
            # Already of its type: nothing to cast, so nothing that could fail or overflow. (A
            # source of 1,000 features spent most of its checks' planning on these no-ops.)
            typed[f.name] = raw
            continue
        if f.type == "int" and isinstance(found[f.source_column], _TIMES):  # every time has its seconds: nothing can fail
            typed[f.name] = epoch_seconds_sql(raw, found[f.source_column])
            continue
        if f.type == "string" and isinstance(found[f.source_column], T.DecimalType):  # every decimal has its text
            typed[f.name] = decimal_text_sql(raw, found[f.source_column])
            continue
        if f.type == "string_list" and isinstance(getattr(found[f.source_column], "elementType", None), T.DecimalType):
            typed[f.name] = f"transform({raw}, _d -> {decimal_text_sql('_d', found[f.source_column].elementType)})"
            continue
        typed[f.name] = f"try_cast({raw} AS {type_name})"
        # a failed cast is bad input: read as a null it would delete the stored value
        reasons.append(_reason(f"{raw} IS NOT NULL AND {typed[f.name]} IS NULL", f"{f.name}: does not fit {type_name}"))
        if f.type == "float":
            reasons.append(_beyond_range(finite_sql(f"try_cast({raw} AS DOUBLE)"), typed[f.name], f))
    latest = collect_reasons(latest, reasons)
    return latest.selectExpr(
        *[ident(k) for k in keys],
        *[f"{typed[f.name]} AS {ident(f.name)}" for f in source.features],
        *([ident(source.timestamp_column)] if source.timestamp_column else []),
        ident(REASONS),
        ident(CONFLICTS),
    )


def long_features(df: DataFrame, source: SourceDef, entity: EntityDef, per_date: bool = False, unique: bool = False) -> DataFrame:
    """Latest value per (entity, feature), pivoted into one row per entity.

    Rows of feature names that are not defined are not part of the snapshot (counted
    by the job as ``ignored_rows``). A value that does not fit its feature's type is
    bad input for the whole entity. With ``per_date`` one row per entity and date.
    ``unique``: one row per (entity, name) was counted (see :func:`latest_per_key`).
    """
    keys = key_columns(source, entity) + ([source.date_column] if per_date else [])
    by_column = {f.source_column: f for f in source.features}
    found = df.schema[source.value_column].dataType
    rows = df.where(col(source.name_column).isin(list(by_column)))
    latest = latest_per_key(rows, source, [*keys, source.name_column], unique)
    value = col(source.value_column)
    aggs, reasons = [], []
    for column, feature in by_column.items():
        picked = F.first(F.when(col(source.name_column) == column, value), ignorenulls=True)
        aggs.append(picked.alias(f"_raw_{feature.name}"))
    pivoted = latest.groupBy(*[col(k) for k in keys]).agg(
        *aggs, F.flatten(F.collect_list(REASONS)).alias(REASONS), F.sum(CONFLICTS).cast("int").alias(CONFLICTS)
    )
    cols = []
    for feature in by_column.values():
        typed, bad = _long_value(F.col(f"_raw_{feature.name}"), found, feature)
        reasons += bad
        cols.append(typed.alias(feature.name))
    out = pivoted.select(*[col(k) for k in keys], *cols, REASONS, CONFLICTS, *[F.col(f"_raw_{f.name}") for f in by_column.values()])
    out = collect_reasons(out, reasons)
    return out.drop(*[f"_raw_{f.name}" for f in by_column.values()])


def _is_infinite(c: Column) -> Column:
    return F.abs(c) == float("inf")


def _is_finite(c: Column) -> Column:
    return ~F.isnan(c) & ~_is_infinite(c)


def finite_sql(c: str) -> str:
    """SQL text of :func:`_is_finite` (neither NaN nor infinite; null for null)."""
    return f"(NOT isnan({c}) AND NOT (abs({c}) = {literal(float('inf'))}))"


def _beyond_range(finite: Column | str, typed: Column | str, feature: FeatureDef) -> Column:
    """A finite number that became inf in the feature's type is bad input: written as
    inf (not written, a delete) it would lose the stored value. (Columns, or SQL text.)"""
    text = f"{feature.name}: beyond {feature.precision or 'float64'} range"
    if isinstance(finite, str):
        return _reason(f"{finite} AND abs({typed}) = {literal(float('inf'))}", text)
    return _reason(finite & _is_infinite(typed), text)


def _long_value(raw: Column, found: T.DataType, feature: FeatureDef) -> tuple[Column, list[Column]]:
    """A long layout's value (of the value column's type ``found``) as ``feature``'s type,
    and the reasons it is bad input. Never null for a value that is there: a value that
    does not fit is bad input, since a null would delete the stored value."""
    name, present = feature.name, raw.isNotNull()
    text = F.trim(raw) if isinstance(found, T.StringType) else None
    if feature.type == "string":
        return raw.try_cast("string"), []
    if feature.type == "json":  # JSON text (the schema check allows only a string value column), made canonical later
        return raw, []
    if feature.type == "bool":
        if isinstance(found, T.BooleanType):
            typed = raw
        elif text is not None:
            word = F.lower(text)
            typed = F.when(word.isin(*_TRUE_TEXT), True).when(word.isin(*_FALSE_TEXT), False)
        else:
            typed = F.when(raw == 1, True).when(raw == 0, False)
        return typed, [_reason(present & typed.isNull(), f"{name}: not a bool (true/false, 1/0)")]
    if feature.type == "int":
        if text is not None:
            typed = _int_from_text(text)
        elif isinstance(found, (T.FloatType, T.DoubleType)):
            d = raw.try_cast("double")
            whole = d.try_cast("long")  # truncates; null for NaN, inf and beyond int64
            typed = F.when((whole.try_cast("double") == d) & (d < _INT64_END), whole)
        elif isinstance(found, T.DecimalType):
            whole = raw.try_cast("long")
            typed = F.when(whole == raw, whole)  # compared as decimals: exact
        else:
            typed = raw.try_cast("long")  # integral, or boolean as 1/0
        return typed, [_reason(present & typed.isNull(), f"{name}: not an integer within int64")]
    if text is not None:
        finite = text.rlike(_NUMBER_TEXT)
        d = F.when(finite, text.try_cast("double"))
        for v, words in _SPELLED:
            d = d.when(F.lower(text).isin(*words), F.lit(v))
    else:
        d = raw.try_cast("double")
        finite = _is_finite(d)
    typed = d.try_cast(spark_type(feature))
    return typed, [_reason(present & d.isNull(), f"{name}: not a number"), _beyond_range(finite, typed, feature)]


def _int_from_text(text: Column) -> Column:
    """The int64 a number text denotes exactly (`7`, `-7`, `1.0`, `1.0E7`, `100e-2`), else null.

    Whole or not is read off the digits; the value goes through decimal(38,0), which is
    exact for whole numbers (a double is not beyond 2^53).
    """
    whole = F.regexp_extract(text, r"^[+-]?([0-9]*)", 1)
    fraction = F.regexp_extract(text, r"\.([0-9]*)", 1)
    exponent_text = F.regexp_extract(text, r"[eE]([+-]?[0-9]+)$", 1)
    exponent = F.when(exponent_text == "", 0).otherwise(exponent_text.try_cast("long"))  # long: no overflow below
    # up to the last non-zero digit: whole when that digit is left of the decimal point
    significant = F.regexp_replace(F.concat(whole, fraction), "0+$", "")
    integral = (significant == "") | (F.length(significant) <= F.length(whole) + exponent)
    return F.when(text.rlike(_NUMBER_TEXT) & integral, text.try_cast("decimal(38,0)").try_cast("long"))


def tag_value_problems(df: DataFrame, source: SourceDef) -> DataFrame:
    """Add reasons for values the format cannot represent (bad input, not nulls). json
    columns become canonical JSON text here (jobs/json_values.py)."""
    df, reasons = json_values.canonical_json(df, source)
    inf = literal(float("inf"))
    for f in source.features:
        c = ident(f.name)
        # No lambdas (exists(c, x -> ...)): Spark runs them without generated code, 7x slower
        # here (3 s of a 1M-entity snapshot's embeddings). A NaN probe finds NaN, and null
        # elements (array_contains is null then); array_max/min find the infinities.
        if f.type == "embedding":
            reasons.append(
                _reason(f"{c} IS NOT NULL AND size({c}) != {f.dimension}", f"{f.name}: embedding dimension is not {f.dimension}")
            )
            non_finite = (
                f"coalesce(array_contains({c}, CAST('NaN' AS FLOAT)), true) OR abs(array_max({c})) = {inf} OR abs(array_min({c})) = {inf}"
            )
            reasons.append(_reason(f"{c} IS NOT NULL AND ({non_finite})", f"{f.name}: embedding element is null or not finite"))
        elif f.type in ("int_list", "string_list", "float_list"):  # sorted, a null comes first
            reasons.append(_reason(f"size({c}) > 0 AND try_element_at(sort_array({c}), 1) IS NULL", f"{f.name}: null list element"))
        if f.type == "float_list":  # an element beyond float32 range (precision float32) is infinite by now
            nan = f"CAST('NaN' AS {'FLOAT' if f.precision == 'float32' else 'DOUBLE'})"
            non_finite = f"array_contains({c}, {nan}) OR abs(array_max({c})) = {inf} OR abs(array_min({c})) = {inf}"
            text = f"{f.name}: float_list element is NaN or infinite" + (" (or beyond float32 range)" if f.precision == "float32" else "")
            reasons.append(_reason(f"coalesce({non_finite}, false)", text))
        elif f.type == "string" and f.max_length:
            reasons.append(_reason(f"length({c}) > {f.max_length}", f"{f.name}: longer than {f.max_length} characters"))
    return collect_reasons(df, reasons).drop(*json_values.problem_columns(source))


def with_entity_id(df: DataFrame, source: SourceDef, entity: EntityDef) -> DataFrame:
    """``_id``: the entity id (serializers.keys.entity_id, as a column): key parts joined, ints in decimal."""
    parts = [col(c).cast("string") for c in key_columns(source, entity)]
    return df.withColumn(ENTITY_ID, F.concat_ws(KEY_SEPARATOR, *parts))


def feature_specs(source: SourceDef) -> tuple[FeatureSpec, ...]:
    # json columns hold canonical text by the writers' turn (tag_value_problems)
    return specs_of(source.features)


def _json_map_partition(specs: tuple[FeatureSpec, ...], batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """Append JSON_MAP and NON_FINITE to each batch, encoding only rows without reasons."""
    for batch in batches:
        good = np.asarray(pc.equal(pc.list_value_length(batch.column(REASONS)), 0).fill_null(True).to_numpy(zero_copy_only=False))
        idx = np.flatnonzero(good)
        sub = batch.take(pa.array(idx, pa.int64()))
        maps, dropped = encode_json_maps(sub, specs)
        # Scatter back: a null index gives a null value for the rows already bad.
        position = np.full(batch.num_rows, -1, np.int64)
        position[idx] = np.arange(len(idx))
        where = pa.array(position, mask=~good)
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, maps.take(where), pa.array(dropped).take(where)],
            names=[*batch.schema.names, JSON_MAP, NON_FINITE],
        )


def with_json_maps(df: DataFrame, source: SourceDef, max_bytes: int) -> DataFrame:
    """Add the SQL store's JSON object per good row; a larger one than ``max_bytes`` is bad input."""
    # Spark's mapInArrow resolves every column by name, and a name it cannot parse (a key or time
    # column of a backtick) fails: the columns the encoder does not read are renamed meanwhile.
    read = {REASONS, *(f.name for f in source.features)}
    plain = df.toDF(*[c if c in read else f"_c{i}" for i, c in enumerate(df.columns)])
    schema = T.StructType([*plain.schema.fields, T.StructField(JSON_MAP, T.StringType()), T.StructField(NON_FINITE, T.IntegerType())])
    out = plain.mapInArrow(partial(_json_map_partition, feature_specs(source)), schema).toDF(*df.columns, JSON_MAP, NON_FINITE)
    reasons = [_reason(F.octet_length(JSON_MAP) > max_bytes, f"features JSON larger than {max_bytes:,} bytes (sql.max_map_bytes)")]
    # JSONB on PostgreSQL cannot hold U+0000 in a string (CockroachDB can): keep such rows out.
    for f in source.features:
        if f.type == "string":
            reasons.append(_reason(F.col(f.name).contains("\x00"), f"{f.name}: NUL character (not storable in JSONB)"))
        elif f.type == "string_list":
            reasons.append(_reason(F.exists(f.name, lambda x: x.contains("\x00")), f"{f.name}: NUL character (not storable in JSONB)"))
        elif f.type == "json":
            reasons.append(_reason(json_values.nul_in_json_sql(ident(f.name)), f"{f.name}: NUL character (not storable in JSONB)"))
    return collect_reasons(out, reasons)


def quarantine_rows(df: DataFrame, source: SourceDef, date: str | None, stage: str) -> DataFrame:
    """Bad rows as kept aside: the whole original row as JSON, with the reasons.

    ``date`` None: each row's own date column (a run over a range of dates)."""
    content = [c for c in df.columns if c not in (REASONS, JSON_MAP, NON_FINITE, CONFLICTS, AS_OF, AS_OF_US)]
    ds = F.lit(date).cast("date") if date is not None else col(source.date_column).cast("date")
    return df.where(is_bad(df)).select(
        F.lit(source.name).alias("source"),
        ds.alias("ds"),
        F.lit(stage).alias("stage"),
        F.col(REASONS).alias("reasons"),
        F.to_json(F.struct(*[col(c) for c in content])).alias("row"),
    )


def latest_good_date(df: DataFrame, source: SourceDef, entity: EntityDef) -> DataFrame:
    """Of per-(entity, date) rows, each entity's good row of its latest date, with AS_OF.

    What a run over a range writes: the state that applying the dates in order leaves
    (a date on which an entity's row is bad input leaves the previous date's values)."""
    window = Window.partitionBy(*[col(k) for k in key_columns(source, entity)]).orderBy(col(source.date_column).desc())
    latest = df.where(~is_bad(df)).withColumn("_date_rank", F.row_number().over(window)).where("_date_rank = 1").drop("_date_rank")
    return with_as_of(latest, source)


def with_as_of(df: DataFrame, source: SourceDef) -> DataFrame:
    """AS_OF: the end of the row's date in UTC epoch seconds (time-zone free arithmetic)."""
    days = F.datediff(F.date_add(col(source.date_column), 1), F.lit("1970-01-01").cast("date"))
    return df.withColumn(AS_OF, days.cast("long") * 86400)


def encode_ready(df: DataFrame, source: SourceDef) -> DataFrame:
    """The good rows, only the columns the writers need: _id, features in order, [AS_OF, [AS_OF_US]]."""
    return df.where(~is_bad(df)).select(ENTITY_ID, *[col(f.name) for f in source.features], *_as_of_columns(df))


def snapshot_for_checks(checked: DataFrame, tagged: DataFrame, source: SourceDef, entity: EntityDef, per_date: bool = False) -> DataFrame:
    """One row per entity as de-duplicated (bad values included), plus one row per row
    whose key is unusable (keys as read, features null): what the expectations see."""
    keys = key_columns(source, entity) + ([source.date_column] if per_date else [])
    features = [f.name for f in source.features]
    unusable = tagged.where(is_bad(tagged)).selectExpr(
        *[ident(k) for k in keys],
        *[f"CAST(NULL AS {spark_type(f).simpleString()}) AS {ident(f.name)}" for f in source.features],
        f"0 AS {ident(CONFLICTS)}",
        f"CAST(NULL AS STRING) AS {ident(ENTITY_ID)}",
    )
    return checked.select(*[col(c) for c in keys + features], F.col(CONFLICTS).cast("int").alias(CONFLICTS), ENTITY_ID).unionByName(
        unusable
    )


def sql_ready(df: DataFrame) -> DataFrame:
    """The good rows for the SQL writers: _id, JSON object, count of omitted NaN/inf, [AS_OF, [AS_OF_US]]."""
    return df.where(~is_bad(df)).select(ENTITY_ID, JSON_MAP, NON_FINITE, *_as_of_columns(df))


def _as_of_columns(df: DataFrame) -> list[str]:
    """Each row's as-of time, where the run has one per row (a range of dates, event times)."""
    return [c for c in (AS_OF, AS_OF_US) if c in df.columns]
