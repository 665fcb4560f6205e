"""The SQL store's value: one JSON object per entity, keyed by feature name.

Built column-wise with Arrow compute: each feature becomes a column of ``"name":value,``
fragments (null where the value is not written), and one element-wise concatenation
assembles the objects. Numbers use the canonical float text of :mod:`floats`
(embedding elements, and float_list ones of ``precision: float32``, in float32 digits);
strings are escaped as Python's ``json.dumps`` does with ``ensure_ascii=False``; a ``json``
feature is its canonical text, the value itself (:mod:`json_value`); no whitespace anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from serializers.batch import FeatureSpec
from serializers.columnar import json_texts
from serializers.floats import format_float_array

# Characters JSON requires to be escaped inside a string.
_NEEDS_ESCAPE = r'[\x00-\x1f"\\]'


def _json_strings(arr: pa.Array) -> pa.Array:
    """Quote and escape a string array; rows that need escapes go through ``json.dumps``."""
    arr = arr.cast(pa.string())
    quoted = pc.binary_join_element_wise('"', arr, '"', "")
    needs = pc.match_substring_regex(arr, _NEEDS_ESCAPE).fill_null(False)
    if not pc.any(needs).as_py():
        return quoted
    py = quoted.to_pylist()
    for i in np.flatnonzero(needs.to_numpy(zero_copy_only=False)):
        py[i] = json.dumps(arr[int(i)].as_py(), ensure_ascii=False)
    return pa.array(py, pa.string())


def _json_array(arr: pa.Array, element_text) -> pa.Array:
    """``[a,b,...]`` per list (null list -> null); ``element_text`` formats the flat values."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(arr) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    texts = element_text(pc.list_flatten(arr))
    if texts.null_count:
        raise ValueError("a list element is null or not finite: the checks before encoding should have caught it")
    lists = pa.ListArray.from_arrays(pa.array(offsets), texts, mask=arr.is_null())
    joined = pc.binary_join(lists, ",")
    return pc.binary_join_element_wise("[", joined, "]", "")


def json_value_column(spec: FeatureSpec, arr: pa.Array) -> tuple[pa.Array, int]:
    """JSON text of each value (null = not written) and the count of NaN/inf dropped."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if spec.type == "float":
        return format_float_array(arr, float32=spec.options.get("precision") == "float32")
    if spec.type == "int":
        return pc.cast(pc.cast(arr, pa.int64()), pa.string()), 0
    if spec.type == "bool":
        return pc.if_else(arr, pa.scalar("true"), pa.scalar("false")), 0
    if spec.type == "string":
        return _json_strings(arr), 0
    if spec.type == "embedding":
        return _json_array(arr, lambda flat: format_float_array(flat, float32=True)[0]), 0
    if spec.type == "int_list":
        return _json_array(arr, lambda flat: pc.cast(pc.cast(flat, pa.int64()), pa.string())), 0
    if spec.type == "string_list":
        return _json_array(arr, _json_strings), 0
    if spec.type == "float_list":  # each element by the float rule (float32: its shortest float32 digits)
        float32 = spec.options.get("precision") == "float32"
        return _json_array(arr, lambda flat: format_float_array(flat, float32=float32)[0]), 0
    if spec.type == "json":  # the value itself, its canonical text (serializers.json_value), not a string holding it
        if spec.options.get("canonical"):
            return arr.cast(pa.string()), 0
        texts, problems = json_texts(arr, spec.options.get("max_bytes"))
        bad = next((p for p in problems if p is not None), None)
        if bad is not None:
            raise ValueError(f"{spec.name}: {bad}: the checks before encoding should have caught it")
        return pa.array(texts, pa.binary()).cast(pa.string()), 0
    raise ValueError(f"unknown feature type {spec.type!r}")


def encode_json_maps(batch: pa.RecordBatch | pa.Table, specs: Sequence[FeatureSpec]) -> tuple[pa.Array, np.ndarray]:
    """One compact JSON object per row over ``specs`` (columns looked up by feature name, keyed by stored name).

    Returns (string array of objects, per row the number of NaN/inf values omitted).
    Null features are omitted; a row with no written feature is ``{}``.
    """
    fragments = []
    non_finite = np.zeros(batch.num_rows, np.int32)
    for spec in specs:
        column = batch.column(spec.name)
        values, dropped = json_value_column(spec, column)
        if dropped:
            lost = pc.and_(pc.is_valid(column), pc.is_null(values))
            non_finite += np.asarray(lost.to_numpy(zero_copy_only=False), np.int32)
        fragments.append(pc.binary_join_element_wise(json.dumps(spec.stored_name) + ":", values, ",", ""))
    if not fragments:
        return pa.array(["{}"] * batch.num_rows, pa.string()), non_finite
    # Each fragment ends in ','; nulls become '' and the last ',' is trimmed (no value ends
    # in ','). Not null_handling="skip": pyarrow 26 drops rows that are null in every input.
    body = pc.utf8_rtrim(pc.binary_join_element_wise(*fragments, "", null_handling="replace", null_replacement=""), characters=",")
    return pc.binary_join_element_wise("{", body, "}", ""), non_finite
