"""``json`` features in the job: which source columns can hold one, and each value made
canonical (serializers/json_value.py) before anything is checked or written.

A json feature's source column is a string (JSON text, as Feast's ``Json`` is stored), or
a map with string keys, a struct or an array (Feast's ``Map`` and ``Struct``, or any nested
value) of strings, numbers, booleans and such nested values. After :func:`canonical_json`
the column is a string column of canonical JSON text, what both stores hold; a value that
cannot be one (text that is not JSON, NaN or ±inf, an integer beyond int64, larger than its
``max_bytes``, ...) is bad input: its row is quarantined with the reason, never written.
"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from feature_defs import SourceDef
from jobs.sql_text import literal
from serializers.columnar import json_text_column, json_texts, json_values

EXPECTED = "json (a string of JSON text, or a map with string keys, a struct or an array)"
"""What the schema check says a json feature's column must be."""

_LEAVES = (
    T.StringType,
    T.BooleanType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.DecimalType,
    T.NullType,
)


def _nested_problem(found: T.DataType, where: str) -> str | None:
    """Why a nested value of this Spark type has no JSON form (None: it has one)."""
    if isinstance(found, _LEAVES):
        return None
    if isinstance(found, T.ArrayType):
        return _nested_problem(found.elementType, f"{where}[]")
    if isinstance(found, T.MapType):
        if not isinstance(found.keyType, T.StringType):
            return f"{where or 'the map'} has {found.keyType.simpleString()} keys (JSON object keys are strings)"
        return _nested_problem(found.valueType, f"{where}{{}}")
    if isinstance(found, T.StructType):
        names = [f.name for f in found.fields]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            return f"{where or 'the struct'} has field {twice[0]!r} twice"
        for f in found.fields:
            problem = _nested_problem(f.dataType, f"{where}.{f.name}" if where else f.name)
            if problem:
                return problem
        return None
    return f"{where or 'it'} is {found.simpleString()}, which JSON cannot hold"


def json_column_problem(found: T.DataType) -> str | None:
    """Why a source column of type ``found`` cannot hold a json feature (None: it can)."""
    if isinstance(found, T.StringType):
        return None
    if not isinstance(found, (T.MapType, T.StructType, T.ArrayType)):
        return f"has type {found.simpleString()}, expected {EXPECTED}"
    problem = _nested_problem(found, "")
    return None if problem is None else f"has type {found.simpleString()}, expected {EXPECTED}: {problem}"


def _problem_column(name: str) -> str:
    return f"_json_problem_{name}"


def _as_text(value) -> str | None:
    """A bad value as the quarantine shows it: the text as read, or JSON of the value (NaN spelled out)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return json.dumps(value, ensure_ascii=False, default=lambda v: float(v) if isinstance(v, np.floating) else repr(v))


def _canonical(name: str, max_bytes: int, values: pa.Array) -> pa.Array:
    """A json column's values as (canonical text, the reason it is bad input): the text null
    for a null; for a bad value, the value as read (what the quarantine shows)."""
    made, bad = json_text_column(values, max_bytes)
    if bad is None:  # the common case, kept in Arrow
        return pa.StructArray.from_arrays([made.cast(pa.string()), pa.nulls(len(made), pa.string())], names=["text", "problem"])
    texts, problems = made.to_pylist(), bad
    shown = [None if t is None else t.decode("utf-8") for t in texts]
    if any(problems):
        raw = json_values(values)
        shown = [_as_text(raw[i]) if p is not None else t for i, (t, p) in enumerate(zip(shown, problems))]
    reasons = [None if p is None else f"{name}: {p.reason}" for p in problems]
    return pa.StructArray.from_arrays([pa.array(shown, pa.string()), pa.array(reasons, pa.string())], names=["text", "problem"])


def _joined_elements(name: str, values: pa.Array) -> tuple[pa.Array, list[str | None]]:
    """Arrays of strings that are JSON texts (``json_text_elements``) as the JSON text of each array, and per
    row why it is bad input: an element that is not one JSON value by itself (``1, 2`` would
    splice two elements in) or not JSON at all. A null element is JSON's null."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    rows = values.to_pylist()
    flat = [e for row in rows if row is not None for e in row if e is not None]
    texts, problems = json_texts(pa.array(flat, pa.string()))
    joined, reasons, at = [], [], 0
    for row in rows:
        if row is None:
            joined.append(None)
            reasons.append(None)
            continue
        parts, reason = [], None
        for i, element in enumerate(row):
            if element is None:
                parts.append("null")
                continue
            text, problem = texts[at], problems[at]
            at += 1
            if problem is not None and reason is None:
                reason = f"{name}: element {i}: {problem.reason}"
            parts.append(text.decode("utf-8") if text is not None else "null")
        joined.append(None if reason else "[" + ",".join(parts) + "]")
        reasons.append(reason)
    return pa.array(joined, pa.string()), reasons


def _canonical_of(name: str, max_bytes: int, text_elements: bool = False):
    """:func:`_canonical` of one feature, as an Arrow UDF takes it (typed: Arrays to Arrays)."""

    def canonical(values: pa.Array) -> pa.Array:
        strings = pa.types.is_list(values.type) and pa.types.is_string(values.type.value_type)
        if not (text_elements and strings):  # the option reads an array of strings; any other column as it is
            return _canonical(name, max_bytes, values)
        joined, reasons = _joined_elements(name, values)
        made = _canonical(name, max_bytes, joined)
        if not any(reasons):
            return made
        shown = [_as_text(v) if r else t for v, r, t in zip(values.to_pylist(), reasons, made.field("text").to_pylist())]
        problems = [r or p for r, p in zip(reasons, made.field("problem").to_pylist())]
        return pa.StructArray.from_arrays([pa.array(shown, pa.string()), pa.array(problems, pa.string())], names=["text", "problem"])

    return canonical


def canonical_json(df: DataFrame, source: SourceDef) -> tuple[DataFrame, list]:
    """The source's json columns as canonical JSON text, and the reasons (one column each,
    null where the value is good) to add to the rows' problems; unchanged without json
    features. An Arrow UDF per json column: only that column goes through Python."""
    jsons = [f for f in source.features if f.type == "json"]
    for f in jsons:
        made = F.arrow_udf(_canonical_of(f.name, f.options["max_bytes"], bool(f.json_text_elements)), "text string, problem string")
        df = df.withColumn(_problem_column(f.name), made(F.col(f.name)))
        df = df.withColumn(f.name, F.col(_problem_column(f.name)).getField("text"))
    return df, [F.col(_problem_column(f.name)).getField("problem") for f in jsons]


def problem_columns(source: SourceDef) -> list[str]:
    """The columns :func:`canonical_json` adds (dropped once their reasons are collected)."""
    return [_problem_column(f.name) for f in source.features if f.type == "json"]


# An escape of U+0000 in canonical text: "\u0000" after an even number of backslashes
# (an odd one would make it the text "\\u0000", an escaped backslash then "u0000").
_NUL_ESCAPE = literal(r"(^|[^\\])(\\\\)*\\u0000")


def nul_in_json_sql(column: str) -> str:
    """SQL: the canonical JSON text in ``column`` (a quoted identifier) holds U+0000 in a
    string, which PostgreSQL's JSONB cannot store."""
    return f"{column} RLIKE {_NUL_ESCAPE}"
