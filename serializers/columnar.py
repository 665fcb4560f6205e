"""Column-wise encoder: one Arrow array of a feature in, one binary array of values out.

Produces exactly the bytes of :func:`serializers.scalar.encode` (tests pin this), but
works on whole columns with Arrow compute and numpy. The only per-value Python calls
left are Snappy compression of list values (no vectorised Snappy exists) and ``json``
values, which are structured documents made canonical one at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import snappy

from serializers import json_fast, json_value
from serializers.errors import BadValue
from serializers.floats import format_float_array
from serializers.json_value import BadJson

_TAG_FIELD1_LEN = 0x0A  # field 1, wire type 2 (length-delimited): the only field of each message


def varint_encode(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Protobuf varints of uint64 values: (concatenated bytes, byte length per value)."""
    v = values.astype(np.uint64, copy=False)
    lengths = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        lengths += v >= np.uint64(1 << (7 * k))
    starts = np.zeros(v.shape, dtype=np.int64)
    if v.size:
        np.cumsum(lengths[:-1], out=starts[1:])
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    for k in range(10):
        sel = lengths > k
        if not sel.any():
            break
        byte = ((v[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        more = lengths[sel] > k + 1
        out[starts[sel] + k] = byte | (more.astype(np.uint8) << 7)
    return out, lengths


def _offsets(lengths: np.ndarray) -> np.ndarray:
    off = np.zeros(lengths.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    return off


def concat_rows(a: np.ndarray, a_len: np.ndarray, b: np.ndarray, b_len: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise a[i] ++ b[i] for two packed byte sequences; returns (bytes, row lengths)."""
    out_len = a_len + b_len
    out_off = _offsets(out_len)
    out = np.empty(int(out_off[-1]), dtype=np.uint8)
    a_off, b_off = _offsets(a_len), _offsets(b_len)
    out[np.arange(a.size) + np.repeat(out_off[:-1] - a_off[:-1], a_len)] = a
    out[np.arange(b.size) + np.repeat(out_off[:-1] + a_len - b_off[:-1], b_len)] = b
    return out, out_len


def _binary_array(data: np.ndarray, lengths: np.ndarray, valid: np.ndarray) -> pa.Array:
    """Build a binary array from packed bytes; null rows must have length 0."""
    offsets = _offsets(lengths)
    if offsets[-1] >= 2**31:
        raise OverflowError("encoded batch is over 2 GiB: lower the Arrow batch size")
    validity = pa.array(valid, pa.bool_()).buffers()[1]
    return pa.Array.from_buffers(
        pa.binary(),
        len(valid),
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
        null_count=int(len(valid) - np.count_nonzero(valid)),
    )


def _row_lengths(arr: pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """(valid mask, number of elements per row with 0 for null rows)."""
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return valid, lengths


def _flat_values(arr: pa.ListArray, kind: str) -> pa.Array:
    flat = arr.flatten()
    if flat.null_count:
        raise BadValue(f"null element in {kind}")
    return flat


def _encode_embedding(arr: pa.ListArray, dimension: int) -> pa.Array:
    valid, lengths = _row_lengths(arr)
    if np.any(lengths[valid] != dimension):
        bad = int(np.flatnonzero(valid & (lengths != dimension))[0])
        raise BadValue(f"embedding at batch row {bad} has {lengths[bad]} values, declared dimension is {dimension}")
    floats = np.ascontiguousarray(_flat_values(arr, "embedding").to_numpy(zero_copy_only=False), dtype="<f4")
    if not np.all(np.isfinite(floats)):
        raise BadValue("embedding element is not a finite number")
    # Every row has the same size, so the header (tag + payload length) is one constant.
    size, _ = varint_encode(np.array([4 * dimension], dtype=np.uint64))
    header = np.concatenate([np.array([_TAG_FIELD1_LEN], dtype=np.uint8), size])
    n = int(np.count_nonzero(valid))
    rows = np.empty((n, header.size + 4 * dimension), dtype=np.uint8)
    rows[:, : header.size] = header
    rows[:, header.size :] = floats.view(np.uint8).reshape(n, 4 * dimension)
    return _scatter_valid(rows.ravel(), np.full(n, rows.shape[1], dtype=np.int64), valid)


def _scatter_valid(rows: np.ndarray, row_len: np.ndarray, valid: np.ndarray) -> pa.Array:
    lengths = np.zeros(valid.size, dtype=np.int64)
    lengths[valid] = row_len
    return _binary_array(rows, lengths, valid)


def _encode_int_list(arr: pa.ListArray) -> pa.Array:
    valid, lengths = _row_lengths(arr)
    ints = _flat_values(arr, "int_list").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    payload, elem_len = varint_encode(ints.view(np.uint64))
    # payload bytes per valid row: sum of its elements' varint lengths
    counts = lengths[valid]
    elem_row = np.repeat(np.arange(counts.size), counts)
    payload_len = np.bincount(elem_row, weights=elem_len, minlength=counts.size).astype(np.int64)
    nonempty = payload_len > 0
    size, size_len = varint_encode(payload_len[nonempty])
    hdr_full, hdr_full_len = concat_rows(np.full(size_len.size, _TAG_FIELD1_LEN, dtype=np.uint8), np.ones_like(size_len), size, size_len)
    hdr_len = np.zeros(counts.size, dtype=np.int64)
    hdr_len[nonempty] = hdr_full_len
    rows, row_len = concat_rows(hdr_full, hdr_len, payload, payload_len)
    return _scatter_valid(rows, row_len, valid)


def _encode_float_list(arr: pa.ListArray, float32: bool) -> pa.Array:
    valid, lengths = _row_lengths(arr)
    floats = np.asarray(_flat_values(arr, "float_list").to_numpy(zero_copy_only=False), dtype=np.float64)
    if not np.all(np.isfinite(floats)):
        raise BadValue("float_list element is not a finite number")
    if float32:
        with np.errstate(over="ignore"):
            floats = floats.astype(np.float32)
        if not np.all(np.isfinite(floats)):
            raise BadValue("float_list element is beyond float32 range")
    payload = np.ascontiguousarray(floats, dtype="<f4" if float32 else "<f8").view(np.uint8)
    # a message per valid row: tag, varint(payload size), the packed values; an empty list is no bytes
    payload_len = lengths[valid] * (4 if float32 else 8)
    nonempty = payload_len > 0
    size, size_len = varint_encode(payload_len[nonempty])
    hdr_full, hdr_full_len = concat_rows(np.full(size_len.size, _TAG_FIELD1_LEN, dtype=np.uint8), np.ones_like(size_len), size, size_len)
    hdr_len = np.zeros(payload_len.size, dtype=np.int64)
    hdr_len[nonempty] = hdr_full_len
    rows, row_len = concat_rows(hdr_full, hdr_len, payload, payload_len)
    return _scatter_valid(rows, row_len, valid)


def _value_bytes(flat: pa.Array) -> np.ndarray:
    """The contiguous value bytes of a (possibly sliced) binary array, without copies per value."""
    if len(flat) == 0:
        return np.empty(0, np.uint8)
    offsets = np.frombuffer(flat.buffers()[1], dtype=np.int32, count=flat.offset + len(flat) + 1)[flat.offset :]
    data = flat.buffers()[2]
    raw = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
    return raw[int(offsets[0]) : int(offsets[-1])]


def _encode_string_list(arr: pa.ListArray) -> pa.Array:
    valid, lengths = _row_lengths(arr)
    flat = _flat_values(arr, "string_list").cast(pa.binary())
    str_len = pc.binary_length(flat).to_numpy(zero_copy_only=False).astype(np.int64)
    raw = _value_bytes(flat)
    size, size_len = varint_encode(str_len)
    hdr, hdr_len = concat_rows(np.full(size_len.size, _TAG_FIELD1_LEN, dtype=np.uint8), np.ones_like(size_len), size, size_len)
    elems, elem_len = concat_rows(hdr, hdr_len, raw, str_len)
    # each row's message is its elements back to back
    counts = lengths[valid]
    elem_row = np.repeat(np.arange(counts.size), counts)
    row_len = np.bincount(elem_row, weights=elem_len, minlength=counts.size).astype(np.int64)
    return _scatter_valid(elems, row_len, valid)


def _snappy_column(arr: pa.Array) -> pa.Array:
    return pa.array([None if v is None else snappy.compress(v) for v in arr.to_pylist()], pa.binary())


def _json_converter(t: pa.DataType, strict: bool = True) -> Callable[[Any], Any] | None:
    """What turns ``to_pylist()``'s value of an Arrow type into the value JSON holds: a map
    (a list of pairs there) into a dict, a float32 into ``numpy.float32`` (written in its
    shortest float32 digits). None: the value is right as it is."""
    if pa.types.is_struct(t):
        fields = [(t.field(i).name, _json_converter(t.field(i).type, strict)) for i in range(t.num_fields)]
        if all(c is None for _, c in fields):
            return None
        return lambda v: None if v is None else {n: v[n] if c is None else c(v[n]) for n, c in fields}
    if pa.types.is_map(t):
        item = _json_converter(t.item_type, strict)

        def pairs(v):
            if v is None:
                return None
            out = {k: x if item is None else item(x) for k, x in v}
            if strict and len(out) != len(v):
                raise BadJson(json_value.DUPLICATE_KEY)
            return out

        return pairs
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        element = _json_converter(t.value_type, strict)
        return None if element is None else (lambda v: None if v is None else [element(x) for x in v])
    if pa.types.is_float32(t) or pa.types.is_float16(t):
        return lambda v: None if v is None else np.float32(v)
    return None


def json_text_column(arr: pa.Array, max_bytes: int | None = None) -> tuple[pa.Array, list[BadJson | None] | None]:
    """The canonical JSON text of each value as a binary array (null: a null, or bad input)
    and, when some value is bad input, per row why (None where it is not); None instead of
    the list when no value is. A string or binary column holds JSON texts; any other
    (struct, map, list, numbers, booleans) holds the values themselves. Struct columns of
    scalars and string columns take the fast ways of :mod:`serializers.json_fast`, every
    row they cannot vouch for the reference's (:func:`serializers.json_value.canonical`)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    fast = json_fast.struct_texts(arr) if pa.types.is_struct(arr.type) else None
    if fast is None:
        if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
            texts, problems = _texts_of_strings(arr.to_pylist(), max_bytes)
        else:
            texts, problems = _reference_texts(arr, max_bytes)
        return pa.array(texts, pa.binary()), problems if any(problems) else None
    made, slow = fast
    made = made.cast(pa.binary())
    if max_bytes is not None:
        slow = pc.or_(slow, pc.fill_null(pc.greater(pc.binary_length(made), max_bytes), False))
    redo = np.flatnonzero(slow.to_numpy(zero_copy_only=False))
    if not len(redo):
        return made, None
    texts = made.to_pylist()
    redone, problems_of = _reference_texts(arr.take(pa.array(redo)), max_bytes)
    problems: list[BadJson | None] = [None] * len(arr)
    for row, text, problem in zip(redo.tolist(), redone, problems_of):
        texts[row], problems[row] = text, problem
    return pa.array(texts, pa.binary()), problems if any(problems) else None


def json_texts(arr: pa.Array, max_bytes: int | None = None) -> tuple[list[bytes | None], list[BadJson | None]]:
    """:func:`json_text_column` as lists: the texts, and per row why a value is bad input (None: it is not)."""
    texts, problems = json_text_column(arr, max_bytes)
    return texts.to_pylist(), problems or [None] * len(texts)


def _texts_of_strings(values: list, max_bytes: int | None) -> tuple[list[bytes | None], list[BadJson | None]]:
    texts: list[bytes | None] = []
    problems: list[BadJson | None] = []
    memo = _MEMO.setdefault(max_bytes, {})
    remember, hits = True, 0
    for i, value in enumerate(values):
        if i == MEMO_TRIAL:  # texts that hardly repeat: the memo would only cost
            remember = hits * 10 >= i
        if value is None:
            text, problem = None, None
        elif remember and (known := memo.get(value)) is not None:
            text, problem = known
            hits += 1
        else:
            text, problem = _text_of(value, max_bytes)
            if remember and len(value) <= MEMO_CHARS:
                if len(memo) >= MEMO_TEXTS:
                    memo.clear()  # cheaper than keeping the most recent: texts that repeat come back at once
                memo[value] = (text, problem)
        texts.append(text)
        problems.append(problem)
    return texts, problems


MEMO_CHARS = 512
"""JSON texts up to this long are remembered (up to :data:`MEMO_TEXTS` of them per
process and max_bytes): a column's texts often repeat (a configuration, a few categories),
and the same text always has the same canonical form."""
MEMO_TEXTS = 4096
MEMO_TRIAL = 1024
"""A batch whose first this many texts found fewer than one in ten remembered stops using the memo."""
_MEMO: dict[int | None, dict[str, tuple[bytes | None, BadJson | None]]] = {}


def _text_of(value: str, max_bytes: int | None) -> tuple[bytes | None, BadJson | None]:
    try:
        try:
            text = json_fast.text_canonical(value)
            if max_bytes is not None and text is not None and len(text) > max_bytes:
                raise json_fast.Unsure
        except json_fast.Unsure:
            text = json_value.canonical(value, max_bytes)
        return text, None
    except BadJson as exc:
        return None, exc


def _reference_texts(arr: pa.Array, max_bytes: int | None) -> tuple[list[bytes | None], list[BadJson | None]]:
    convert = _json_converter(arr.type)
    texts: list[bytes | None] = []
    problems: list[BadJson | None] = []
    for value in arr.to_pylist():
        try:
            texts.append(json_value.canonical(value if convert is None else convert(value), max_bytes))
            problems.append(None)
        except BadJson as exc:
            texts.append(None)
            problems.append(exc)
    return texts, problems


def json_values(arr: pa.Array) -> list:
    """The values of a json column as Python values (a map a dict, however its keys repeat; a
    string a JSON text): what :func:`json_texts` writes, or shows of a value it refuses."""
    convert = _json_converter(arr.type, strict=False)
    return arr.to_pylist() if convert is None else [convert(v) for v in arr.to_pylist()]


def _encode_json(arr: pa.Array, max_bytes: int | None) -> pa.Array:
    texts, problems = json_texts(arr, max_bytes)
    for row, problem in enumerate(problems):
        if problem is not None:
            raise BadJson(problem.reason, f"batch row {row}: {problem}")
    return pa.array(texts, pa.binary())


def _canonical_column(arr: pa.Array, max_bytes: int | None) -> pa.Array:
    """A string column the job made canonical already (jobs/json_values.py): only its size checked."""
    out = arr.cast(pa.binary())
    if max_bytes is not None and len(out) and (pc.max(pc.binary_length(out)).as_py() or 0) > max_bytes:
        raise BadJson(json_value.too_large(max_bytes))
    return out


def encode_column(feature_type: str, arr: pa.Array, **options: Any) -> tuple[pa.Array, int]:
    """Encode one feature column. Returns (binary array, count of NaN/inf turned into null).

    json: ``canonical=True`` declares a string column of canonical JSON text already (the
    job's, made so before its checks), written as it is; otherwise each value is made
    canonical here."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if feature_type == "float":
        text, non_finite = format_float_array(arr, float32=options.get("precision") == "float32")
        return text.cast(pa.binary()), non_finite
    if feature_type == "int":
        return pc.cast(pc.cast(arr, pa.int64()), pa.string()).cast(pa.binary()), 0
    if feature_type == "bool":
        return pc.if_else(arr, pa.scalar(b"1"), pa.scalar(b"0")), 0
    if feature_type == "string":
        max_length = options.get("max_length")
        if max_length is not None and len(arr) and (pc.max(pc.utf8_length(arr)).as_py() or 0) > max_length:
            raise BadValue(f"string longer than max_length {max_length}")
        return arr.cast(pa.binary()), 0
    if feature_type == "embedding":
        return _encode_embedding(arr, options.get("dimension")), 0
    if feature_type == "json":
        out = _canonical_column(arr, options.get("max_bytes")) if options.get("canonical") else _encode_json(arr, options.get("max_bytes"))
        return (_snappy_column(out) if options.get("compression", "none") == "snappy" else out), 0
    if feature_type == "float_list":  # uncompressed unless declared, as json
        out = _encode_float_list(arr, float32=options.get("precision") == "float32")
        return (_snappy_column(out) if options.get("compression", "none") == "snappy" else out), 0
    if feature_type == "int_list":
        out = _encode_int_list(arr)
    elif feature_type == "string_list":
        out = _encode_string_list(arr)
    else:
        raise ValueError(f"unknown feature type {feature_type!r}")
    if options.get("compression", "snappy") == "snappy":
        out = _snappy_column(out)
    return out, 0
