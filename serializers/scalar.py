"""Reference encoder/decoder, one value at a time.

This is the readable definition of the online format (README "Online format"): readers
in Python can use it as is, and the column-wise encoder used by the jobs is tested to
produce the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import snappy
import xxhash

from serializers import features_pb2
from serializers.floats import format_float

FEATURE_TYPES = ("float", "int", "bool", "string", "embedding", "int_list", "string_list")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class BadValue(ValueError):
    """A value that the format cannot represent (bad input: quarantined, never written)."""


class DecodeError(ValueError):
    """Bytes that are not a valid encoding of the declared type."""


def field_id_int(name: str) -> int:
    """The feature's field id: xxh32 of its UTF-8 name, seed 0."""
    return xxhash.xxh32_intdigest(name.encode("utf-8"), seed=0)


def field_id(name: str) -> bytes:
    """The Redis hash field for a feature: its field id as 4 little-endian bytes."""
    return field_id_int(name).to_bytes(4, "little")


def freshness_field_name(source: str) -> str:
    return "_ts:" + source


def _check_type(feature_type: str) -> None:
    if feature_type not in FEATURE_TYPES:
        raise ValueError(f"unknown feature type {feature_type!r}; expected one of {', '.join(FEATURE_TYPES)}")


def _compressed(options: dict[str, Any]) -> bool:
    return options.get("compression", "snappy") == "snappy"


def encode(feature_type: str, value: Any, **options: Any) -> bytes | None:
    """Encode one value; None means "not written" (null, NaN or ±inf).

    Options (as in the feature definition): ``precision`` ("float64" | "float32") for
    floats, ``dimension`` for embeddings, ``compression`` ("snappy" | "none") for lists,
    ``max_length`` (characters) for strings. Raises :class:`BadValue` for bad input.
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


def decode(feature_type: str, data: bytes, **options: Any) -> Any:
    """Decode bytes written for a feature of ``feature_type`` (same options as encode)."""
    _check_type(feature_type)
    try:
        if feature_type == "float":
            return float(data.decode("ascii"))
        if feature_type == "int":
            return int(data.decode("ascii"))
        if feature_type == "bool":
            if data not in (b"0", b"1"):
                raise DecodeError(f"bool must be b'0' or b'1', got {data[:16]!r}")
            return data == b"1"
        if feature_type == "string":
            return data.decode("utf-8")
        if feature_type == "embedding":
            values = list(features_pb2.Embedding.FromString(data).values)
            dimension = options.get("dimension")
            if dimension is not None and len(values) != dimension:
                raise DecodeError(f"embedding has {len(values)} values, declared dimension is {dimension}")
            return values
        raw = snappy.decompress(data) if _compressed(options) else data
        message = features_pb2.IntList if feature_type == "int_list" else features_pb2.StringList
        return list(message.FromString(raw).values)
    except DecodeError:
        raise
    except Exception as exc:  # protobuf, snappy, unicode and int parsing all raise differently
        raise DecodeError(f"cannot decode {len(data)} bytes as {feature_type}: {exc}") from exc
