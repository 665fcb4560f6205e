"""Stored bytes (or SQL JSON values) back to Python values, a column at a time.

A column of one feature across a batch's entities is decoded in one go where the type
allows it (numbers: one charset check over the joined bytes, then ``float``/``int`` over
the column; embeddings: the packed float32 body read straight into numpy). Anything the
fast path does not accept goes through the reference decoder (``serializers.decode``),
value by value, so a corrupt value is reported as such and never stops the rest.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from feature_defs import FeatureDef
from serializers import decode
from serializers.scalar import INT64_MAX, INT64_MIN, DecodeError

BAD = object()
"""A stored value that did not decode (its status says so, a counter counts it)."""

_FLOAT_CHARS = b"0123456789.-+eE"
_INT_CHARS = b"0123456789-"
_BOOLS = {b"1": True, b"0": False}
_FLOAT32_MAX = float(np.finfo(np.float32).max)


def _slow(feature: FeatureDef, raws: list, as_list: bool) -> list:
    out = []
    for raw in raws:
        if raw is None:
            out.append(None)
            continue
        try:
            value = decode(feature.type, raw, **feature.options)
        except DecodeError:
            out.append(BAD)
            continue
        if feature.type == "embedding" and not as_list:
            value = _frozen(np.asarray(value, np.float32))
        out.append(value)
    return out


def _floats(raws: list) -> list | None:
    joined = b"".join(filter(None, raws))
    # the reference refuses a leading '+' (the charset allows it after an exponent)
    if joined.translate(None, _FLOAT_CHARS) or joined.count(b"+") != joined.count(b"e+") + joined.count(b"E+"):
        return None
    out = [None if r is None else float(r) for r in raws]
    return out if all(map(math.isfinite, filter(None, out))) else None  # 1e999 parses as inf


def _ints(raws: list) -> list | None:
    if b"".join(filter(None, raws)).translate(None, _INT_CHARS):
        return None
    out = [None if r is None else int(r) for r in raws]
    present = [v for v in out if v is not None]
    return out if not present or (min(present) >= INT64_MIN and max(present) <= INT64_MAX) else None


def _embeddings(raws: list, dimension: int, as_list: bool) -> list | None:
    """Embedding messages as the writers write them: tag 0x0a, the body's length as a
    varint, then ``dimension`` packed little-endian float32."""
    size = dimension * 4
    head = b"\x0a" + _varint(size)
    start = len(head)
    out = []
    for r in raws:
        if r is None:
            out.append(None)
            continue
        if len(r) != start + size or not r.startswith(head):
            return None
        values = np.frombuffer(r, "<f4", dimension, start)
        if not np.isfinite(values).all():
            return None
        out.append(values.tolist() if as_list else _frozen(values.copy()))
    return out


def _frozen(arr: np.ndarray) -> np.ndarray:
    """Read-only: a cached array is handed to every caller, none may change it in place."""
    arr.setflags(write=False)
    return arr


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def decode_column(feature: FeatureDef, raws: list, *, as_list: bool = False) -> list:
    """The values of ``raws`` (None: not stored; :data:`BAD`: did not decode)."""
    kind = feature.type
    fast = None
    try:
        if kind == "float":
            fast = _floats(raws)
            if fast is not None and feature.precision == "float32" and any(v is not None and abs(v) > _FLOAT32_MAX for v in fast):
                fast = None
        elif kind == "int":
            fast = _ints(raws)
        elif kind == "bool":
            fast = [None if r is None else _BOOLS[r] for r in raws]
        elif kind == "string" and feature.max_length is None:
            fast = [None if r is None else r.decode("utf-8") for r in raws]
        elif kind == "embedding":
            fast = _embeddings(raws, feature.dimension, as_list)
    except (ValueError, KeyError, UnicodeDecodeError):
        fast = None
    return fast if fast is not None else _slow(feature, raws, as_list)


def from_json(feature: FeatureDef, value: Any, *, as_list: bool = False) -> Any:
    """A value of the SQL store's JSON map as the feature's type (BAD when it is not one)."""
    kind = feature.type
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "float":
        try:
            x = float(value) if number else math.inf
        except OverflowError:  # an int beyond float64
            return BAD
        if not math.isfinite(x) or (feature.precision == "float32" and abs(x) > _FLOAT32_MAX):
            return BAD
        return x
    if kind == "int":
        return value if isinstance(value, int) and not isinstance(value, bool) and INT64_MIN <= value <= INT64_MAX else BAD
    if kind == "bool":
        return value if isinstance(value, bool) else BAD
    if kind == "string":
        return value if isinstance(value, str) else BAD
    if not isinstance(value, list):
        return BAD
    if kind == "embedding":
        if len(value) != feature.dimension or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return BAD
        with np.errstate(over="ignore"):
            arr = np.asarray(value, np.float32)  # beyond float32 becomes inf: refused below
        if not np.isfinite(arr).all():
            return BAD
        return arr.tolist() if as_list else _frozen(arr)
    if kind == "int_list":
        ok = all(isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX for v in value)
    else:
        ok = all(isinstance(v, str) for v in value)
    return value if ok else BAD
