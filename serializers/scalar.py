"""Reference encoder/decoder, one value at a time.

This is the readable definition of the online format (serializers/FORMAT.md): readers
in Python can use it as is, and the column-wise encoder used by the jobs is tested to
produce the same bytes.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from typing import Any

import snappy
import xxhash

from serializers import features_pb2, json_value
from serializers.errors import BadValue, DecodeError
from serializers.floats import format_float

FEATURE_TYPES = ("float", "int", "bool", "string", "embedding", "int_list", "string_list", "json", "float_list")
"""Every type of the format; ``json`` from version 1.1, ``float_list`` from 1.3."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
__all__ = ["FEATURE_TYPES", "BadValue", "DecodeError", "decode", "encode", "field_id", "field_id_int"]


def field_id_int(name: str) -> int:
    """The feature's field id: xxh32 of its UTF-8 name, seed 0."""
    return xxhash.xxh32_intdigest(name.encode("utf-8"), seed=0)


def field_id(name: str) -> bytes:
    """The Redis hash field for a feature: its field id as 4 little-endian bytes."""
    return field_id_int(name).to_bytes(4, "little")


def _check_type(feature_type: str) -> None:
    if feature_type not in FEATURE_TYPES:
        raise ValueError(f"unknown feature type {feature_type!r}; expected one of {', '.join(FEATURE_TYPES)}")


def _compressed(options: dict[str, Any]) -> bool:
    return options.get("compression", "snappy") == "snappy"


def _snappy_declared(options: dict[str, Any]) -> bool:
    return options.get("compression", "none") == "snappy"  # json, float_list: uncompressed unless declared


def encode(feature_type: str, value: Any, **options: Any) -> bytes | None:
    """Encode one value; None means "not written" (null, NaN or ±inf).

    Options (as in the feature definition): ``precision`` ("float64" | "float32") for
    floats and float lists, ``dimension`` for embeddings, ``compression`` ("snappy" | "none")
    for lists and json (int and string lists default to snappy, json and float lists to
    none: packed floats rarely shrink), ``max_length`` (characters) for strings,
    ``max_bytes`` for json (of the JSON text, before compression). Raises :class:`BadValue`
    for bad input. A json value is a Python value or a JSON text (serializers.json_value.canonical).
    """
    _check_type(feature_type)
    if value is None:
        return None
    if feature_type == "float":
        text = format_float(float(value), float32=options.get("precision") == "float32")
        return None if text is None else text.encode("ascii")
    if feature_type == "int":
        if isinstance(value, bool) or int(value) != value:
            raise BadValue(f"not an integer: {value!r}")
        v = int(value)
        if not INT64_MIN <= v <= INT64_MAX:
            raise BadValue(f"int {v} is outside int64")
        return str(v).encode("ascii")
    if feature_type == "bool":
        return b"1" if value else b"0"
    if feature_type == "string":
        max_length = options.get("max_length")
        if max_length is not None and len(value) > max_length:
            raise BadValue(f"string of {len(value)} characters is longer than max_length {max_length}")
        return str(value).encode("utf-8")
    if feature_type == "embedding":
        return _encode_embedding(value, options.get("dimension"))
    if feature_type == "json":
        text = json_value.canonical(value, options.get("max_bytes"))
        return None if text is None else snappy.compress(text) if _snappy_declared(options) else text
    if feature_type == "float_list":
        data = _encode_float_list(value, float32=options.get("precision") == "float32")
        return snappy.compress(data) if _snappy_declared(options) else data
    if feature_type == "int_list":
        ints = list(value)
        for x in ints:
            if x is None:
                raise BadValue("null element in int_list")
            if not INT64_MIN <= int(x) <= INT64_MAX:
                raise BadValue(f"int_list element {x} is outside int64")
        data = features_pb2.IntList(values=ints).SerializeToString()
        return snappy.compress(data) if _compressed(options) else data
    # string_list
    strings = list(value)
    if any(s is None for s in strings):
        raise BadValue("null element in string_list")
    data = features_pb2.StringList(values=strings).SerializeToString()
    return snappy.compress(data) if _compressed(options) else data


def _encode_embedding(value: Sequence[float], dimension: int | None) -> bytes:
    values = list(value)
    if dimension is not None and len(values) != dimension:
        raise BadValue(f"embedding has {len(values)} values, declared dimension is {dimension}")
    for x in values:
        if x is None or not math.isfinite(x):
            raise BadValue(f"embedding element {x!r} is not a finite number")
    return features_pb2.Embedding(values=values).SerializeToString()


def _encode_float_list(value: Sequence[float], float32: bool) -> bytes:
    values = []
    for x in value:
        if x is None:
            raise BadValue("null element in float_list")
        try:
            x = float(x)
        except OverflowError:
            raise BadValue("float_list element is an integer beyond float64 range") from None
        if not math.isfinite(x):
            raise BadValue(f"float_list element {x!r} is not a finite number")
        values.append(x)
        if float32:
            try:
                struct.pack("<f", x)  # the protobuf runtime would write infinity
            except OverflowError:
                raise BadValue(f"float_list element {x!r} is beyond float32 range") from None
    message = features_pb2.Float32List if float32 else features_pb2.FloatList
    return message(values=values).SerializeToString()


_INT_TEXT = re.compile(rb"-?[0-9]+")
# Decimal notation only: Python's float() would also take "nan", "inf", " 1_0 ", which no writer emits.
_FLOAT_TEXT = re.compile(rb"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _fail(feature_type: str, data: bytes, why: str) -> DecodeError:
    return DecodeError(f"cannot decode {len(data)} bytes as {feature_type}: {why}")


def _decode_float(data: bytes, options: dict[str, Any]) -> float:
    if not _FLOAT_TEXT.fullmatch(data):
        raise _fail("float", data, f"not a decimal number: {data[:24]!r}")
    value = float(data)
    if not math.isfinite(value):
        raise _fail("float", data, "out of float64 range (NaN and infinity are never written)")
    if options.get("precision") == "float32":
        try:
            struct.pack("<f", value)
        except OverflowError:
            raise _fail("float", data, "out of float32 range") from None
    return value


def _decode_int(data: bytes, options: dict[str, Any]) -> int:
    if not _INT_TEXT.fullmatch(data):
        raise _fail("int", data, f"not a decimal integer: {data[:24]!r}")
    if len(data.lstrip(b"-").lstrip(b"0")) > 19:  # also keeps int() below its digit limit
        raise _fail("int", data, "outside int64")
    value = int(data)
    if not INT64_MIN <= value <= INT64_MAX:
        raise _fail("int", data, "outside int64")
    return value


def _decode_bool(data: bytes, options: dict[str, Any]) -> bool:
    if data not in (b"0", b"1"):
        raise DecodeError(f"bool must be b'0' or b'1', got {data[:16]!r}")
    return data == b"1"


def _decode_string(data: bytes, options: dict[str, Any]) -> str:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail("string", data, f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    max_length = options.get("max_length")
    if max_length is not None and len(text) > max_length:
        raise _fail("string", data, f"{len(text)} characters, longer than max_length {max_length}")
    return text


def _parse(feature_type: str, message: type, data: bytes) -> Any:
    try:
        return message.FromString(data)
    except Exception as exc:  # google.protobuf.message.DecodeError, or the runtime's own
        raise _fail(feature_type, data, f"not a {message.__name__} message: {exc}") from None


def _decode_embedding(data: bytes, options: dict[str, Any]) -> list[float]:
    values = list(_parse("embedding", features_pb2.Embedding, data).values)
    dimension = options.get("dimension")
    if dimension is not None and len(values) != dimension:
        raise DecodeError(f"embedding has {len(values)} values, declared dimension is {dimension}")
    if not all(math.isfinite(x) for x in values):
        raise _fail("embedding", data, "an element is NaN or infinite (never written)")
    return values


def _decode_list(feature_type: str, message: type, data: bytes, compressed: bool) -> list:
    if compressed:
        try:
            data = snappy.decompress(data)
        except Exception as exc:  # python-snappy raises a bare UncompressError; its cause says why
            raise _fail(feature_type, data, f"not a Snappy block: {exc.__cause__ or exc or type(exc).__name__}") from None
    return list(_parse(feature_type, message, data).values)


def _decode_json(data: bytes, options: dict[str, Any]) -> Any:
    max_bytes = options.get("max_bytes")
    if _snappy_declared(options):
        # refused before decompressing: a block may declare up to 4 GiB
        declared = json_value.snappy_length(data)
        if declared is None:
            raise _fail("json", data, "not a Snappy block: no length")
        if max_bytes is not None and declared > max_bytes:
            raise _fail("json", data, f"Snappy block of {declared:,} bytes, larger than max_bytes {max_bytes:,}")
        try:
            data = snappy.decompress(data)
        except Exception as exc:
            raise _fail("json", data, f"not a Snappy block: {exc.__cause__ or exc or type(exc).__name__}") from None
    return json_value.decode(data, max_bytes)


def _decode_float_list(data: bytes, options: dict[str, Any]) -> list[float]:
    message = features_pb2.Float32List if options.get("precision") == "float32" else features_pb2.FloatList
    values = _decode_list("float_list", message, data, _snappy_declared(options))
    if not all(map(math.isfinite, values)):
        raise _fail("float_list", data, "an element is NaN or infinite (never written)")
    return values


_DECODERS = {
    "float": _decode_float,
    "int": _decode_int,
    "bool": _decode_bool,
    "string": _decode_string,
    "embedding": _decode_embedding,
    "int_list": lambda data, options: _decode_list("int_list", features_pb2.IntList, data, _compressed(options)),
    "string_list": lambda data, options: _decode_list("string_list", features_pb2.StringList, data, _compressed(options)),
    "json": _decode_json,
    "float_list": _decode_float_list,
}


def decode(feature_type: str, data: bytes, **options: Any) -> Any:
    """Decode bytes written for a feature of ``feature_type`` (same options as encode).

    Malformed bytes (anything no writer produces, bar non-canonical number text such as
    ``007``) raise :class:`DecodeError`, never anything else: readers can tell a corrupt
    value from a bug.
    """
    _check_type(feature_type)
    try:
        return _DECODERS[feature_type](data, options)
    except DecodeError:
        raise
    except Exception as exc:  # safety net: whatever a codec library raises is still bad data
        raise _fail(feature_type, data, f"{type(exc).__name__}: {exc}") from exc
