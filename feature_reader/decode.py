"""Stored bytes (or SQL JSON values) back to Python values, a column at a time.

A column of one feature across a batch's entities is decoded in one go where the type
allows it (numbers: one charset check over the joined bytes, then ``float``/``int`` over
the column; embeddings: the packed float32 body read straight into numpy). Anything the
fast path does not accept goes through the reference decoder (``serializers.decode``),
value by value, so a corrupt value is reported as such and never stops the rest.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from feature_defs import FeatureDef
from serializers import decode
from serializers.json_value import from_parsed, snappy_length
from serializers.scalar import INT64_MAX, INT64_MIN, DecodeError

BAD = object()
"""A stored value that did not decode (its status says so, a counter counts it)."""

MIN_AS_OF, MAX_AS_OF = -62135596800, 253402300799
"""0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: the as-of times a timestamp can show
(Python's datetime and Feast's protobuf Timestamp); past them (milliseconds written where
seconds belong) a source's freshness is unusable."""

_FLOAT_CHARS = b"0123456789.-+eE"
_INT_CHARS = b"0123456789-"
_BOOLS = {b"1": True, b"0": False}
_FLOAT32_MAX = float(np.finfo(np.float32).max)
SMALL = 8
"""Columns of at most this many values skip the one-matrix paths (numpy's fixed costs)."""


def as_of(raw: bytes | None) -> int | object | None:
    """A stored freshness value (decimal epoch seconds, as every writer writes it) as an int;
    None: not stored; :data:`BAD`: anything else, or out of :data:`MIN_AS_OF`..:data:`MAX_AS_OF`."""
    if raw is None:
        return None
    if 0 < len(raw) <= 11 and raw.isdigit():  # the common case: ASCII digits, at most 11 of them: within range
        return int(raw)
    body = raw[1:] if raw[:1] == b"-" else raw
    if not 0 < len(body) <= 12 or not body.isdigit():  # int() would take spaces, '_' and '+' too
        return BAD
    value = int(raw)
    return value if MIN_AS_OF <= value <= MAX_AS_OF else BAD


def as_of_seconds(value: Any) -> int | object:
    """The SQL store's as-of time (epoch seconds as a float8: infinity is a timestamptz too) as an int, or :data:`BAD`.
    Floored, as Redis's freshness field holds it: an event time to the microsecond (1.4) is read in whole seconds."""
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not MIN_AS_OF <= value <= MAX_AS_OF:
        return BAD
    return math.floor(value)


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


JSON_OBJECT_BYTES = 10
"""A json value's Python objects per byte of its JSON text (dicts, lists, str and number
objects: 7.5 to 10 times measured on typical documents), for the cache's size estimate."""


def json_extra_bytes(feats: list[FeatureDef], raws) -> int:
    """What the json values of one row (stored bytes, in ``feats``' order) hold as Python
    objects beyond their stored bytes, estimated from their text's length (a Snappy block
    declares it in its first bytes)."""
    extra = 0
    for f, raw in zip(feats, raws):
        if f.type != "json" or raw is None:
            continue
        size = len(raw)
        if f.options.get("compression") == "snappy":
            # the text's length, as the block declares it; a longer one than max_bytes does not decode: not held
            size, cap = snappy_length(raw) or 0, f.options.get("max_bytes")
            size = size if cap is None else min(size, cap)
        extra += JSON_OBJECT_BYTES * size
    return extra


def _floats(raws: list) -> list | None:
    present = raws if None not in raws else [r for r in raws if r is not None]
    joined = b"".join(present)
    if joined.translate(None, _FLOAT_CHARS):
        return None
    # the reference refuses a leading '+' (the charset allows it after an exponent)
    if b"+" in joined and joined.count(b"+") != joined.count(b"e+") + joined.count(b"E+"):
        return None
    out = list(map(float, raws)) if len(present) == len(raws) else [None if r is None else float(r) for r in raws]
    if b"e" in joined or b"E" in joined or (len(joined) > 300 and max(map(len, present)) > 300):
        return out if all(map(math.isfinite, filter(None, out))) else None  # 1e999 (or 400 digits) parses as inf
    return out


def _ints(raws: list) -> list | None:
    if b"".join(filter(None, raws)).translate(None, _INT_CHARS):
        return None
    out = [None if r is None else int(r) for r in raws]
    present = [v for v in out if v is not None]
    return out if not present or (min(present) >= INT64_MIN and max(present) <= INT64_MAX) else None


@functools.cache
def _head(dimension: int) -> bytes:
    """An embedding message's first bytes: tag 0x0a, then the body's length as a varint."""
    return b"\x0a" + _varint(dimension * 4)


def _embeddings(raws: list, dimension: int, as_list: bool) -> list | None:
    """Embedding messages as the writers write them: tag 0x0a, the body's length as a
    varint, then ``dimension`` packed little-endian float32; the column read as one matrix."""
    head = _head(dimension)
    width = len(head) + dimension * 4
    present = [r for r in raws if r is not None]
    if not present:
        return list(raws)
    if any(len(r) != width or not r.startswith(head) for r in present):
        return None
    if len(present) <= SMALL:  # numpy's fixed costs outweigh a few values: checked as Python floats
        out = []
        for r in raws:
            if r is None:
                out.append(None)
                continue
            values = np.frombuffer(r, "<f4", dimension, len(head))  # read-only: a view of the stored bytes
            listed = values.tolist()
            if not all(map(math.isfinite, listed)):
                return None
            out.append(listed if as_list else values)
        return out
    matrix = np.frombuffer(b"".join(present), np.uint8).reshape(len(present), width)
    values = matrix[:, len(head) :].copy().view("<f4")
    if not np.isfinite(values).all():
        return None
    if as_list:
        rows = iter(values.tolist())
    else:
        rows = iter(_frozen(values))  # each row a read-only view of the column's matrix
    return [None if r is None else next(rows) for r in raws]


def _int_lists(raws: list, compressed: bool) -> list | None:
    """Lists whose elements are each one varint byte (0..127, e.g. ids of a small
    vocabulary): the message is tag 0x0a, its length, the elements; a short Snappy block
    of it is its length, one literal tag, the message. Anything else: the reference."""
    present = [r for r in raws if r is not None]
    if compressed and len(present) > SMALL and len(set(map(len, present))) == 1 and 4 <= len(present[0]) <= 62:
        # one length for the column (lists of one size): checked and read as one matrix
        size = len(present[0])
        m = np.frombuffer(b"".join(present), np.uint8).reshape(len(present), size)
        if (
            (m[:, 0] == size - 2).all()
            and (m[:, 1] == (size - 3) << 2).all()
            and (m[:, 2] == 0x0A).all()
            and (m[:, 3] == size - 4).all()
            and (m[:, 4:] < 0x80).all()
        ):
            rows = iter(m[:, 4:].tolist())
            return [None if r is None else next(rows) for r in raws]
    out = []
    for r in raws:
        if r is None:
            out.append(None)
            continue
        body = r
        if compressed:
            if r == b"\x00":  # the empty message
                out.append([])
                continue
            n = len(r) - 2
            if not 0 < n <= 60 or r[0] != n or r[1] != (n - 1) << 2:
                return None
            body = r[2:]
        if not body:
            out.append([])
            continue
        if len(body) - 2 >= 0x80 or body[0] != 0x0A or body[1] != len(body) - 2 or (len(body) > 2 and max(body[2:]) > 0x7F):
            return None
        out.append(list(body[2:]))
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
        elif kind == "int_list":
            fast = _int_lists(raws, feature.options.get("compression", "snappy") == "snappy")
    except (ValueError, KeyError, UnicodeDecodeError):
        fast = None
    return fast if fast is not None else _slow(feature, raws, as_list)


def _numbers(group: tuple[str, str | None], raws: list) -> list | None:
    """A group's stored numbers (kind "float" or "int", and the float precision) at once; None: the fast path refuses them."""
    kind, precision = group
    try:
        fast = _floats(raws) if kind == "float" else _ints(raws)
    except ValueError:
        return None
    if fast is not None and precision == "float32" and any(v is not None and abs(v) > _FLOAT32_MAX for v in fast):
        return None
    return fast


class ColumnDecoder:
    """Decodes the columns of one feature list at once: the float columns (and the int
    columns) of a batch go through one fast path together, so a small batch pays its fixed
    costs once, not once per feature; a group the fast path refuses is decoded column by
    column, so a corrupt value only costs its own column the slow way."""

    def __init__(self, feats: list[FeatureDef]):
        self.feats = feats
        groups: dict[tuple, list[int]] = {}
        for j, f in enumerate(feats):
            if f.type in ("float", "int"):
                groups.setdefault((f.type, f.precision if f.type == "float" else None), []).append(j)
        self.groups = list(groups.items())
        # a group in consecutive positions (the usual layout: a definition lists its floats together) is one slice
        self._spans = [slice(js[0], js[-1] + 1) if js == list(range(js[0], js[-1] + 1)) else None for _, js in self.groups]
        grouped = {j for _, js in self.groups for j in js}
        self.others = [j for j in range(len(feats)) if j not in grouped]

    def decode_row(self, raws, as_list: bool = False) -> tuple[list, bool]:
        """One entity's stored values (in feature order) decoded: (the values, none of them
        None or BAD). One entity is the common miss: no columns to build and transpose."""
        out = list(raws)
        complete = True
        for (group, js), span in zip(self.groups, self._spans):
            values = raws[span] if span else [raws[j] for j in js]
            if None in values:  # stored bytes or None: nothing here compares by value
                complete = False
            fast = _numbers(group, values)
            if fast is None:
                for j in js:
                    out[j] = v = decode_column(self.feats[j], [raws[j]], as_list=as_list)[0]
                    complete = complete and v is not None and v is not BAD
            elif span:
                out[span] = fast
            else:
                for j, v in zip(js, fast):
                    out[j] = v
        for j in self.others:
            out[j] = v = decode_column(self.feats[j], [raws[j]], as_list=as_list)[0]
            complete = complete and v is not None and v is not BAD
        return out, complete

    def decode(self, columns: list, as_list: bool = False) -> tuple[list[list], list[int]]:
        """(the decoded columns, the columns that may hold None or BAD: the others hold neither)."""
        out: list = [None] * len(self.feats)
        holey = []
        for j in self.others:
            out[j] = decode_column(self.feats[j], columns[j], as_list=as_list)
            holey.append(j)
        for group, js in self.groups:
            n = len(columns[js[0]])
            flat = [v for j in js for v in columns[j]]
            if None in flat:
                holey += js
            fast = _numbers(group, flat)
            if fast is None:
                for j in js:
                    out[j] = decode_column(self.feats[j], columns[j], as_list=as_list)
                holey += js
            else:
                for k, j in enumerate(js):
                    out[j] = fast[k * n : (k + 1) * n]
        return out, sorted(set(holey))


def _float_list(value: list, float32: bool) -> list[float] | object:
    """A float_list's JSON array as Python floats, as its Redis bytes decode (a whole number
    the JSON holds as an integer is a float all the same; float32: the float32 value, widened)."""
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
        return BAD
    try:
        out = [float(v) for v in value]
    except OverflowError:  # an int beyond float64
        return BAD
    if float32:
        with np.errstate(over="ignore"):  # beyond float32 becomes inf: refused below
            out = np.asarray(out, np.float32).tolist()
    return out if all(map(math.isfinite, out)) else BAD


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
    if kind == "json":  # the value itself; its numbers as decoding Redis's text reads them
        try:
            return from_parsed(value)
        except ValueError:
            return BAD
    if not isinstance(value, list):
        return BAD
    if kind == "embedding":
        if len(value) != feature.dimension or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            return BAD
        try:
            with np.errstate(over="ignore"):
                arr = np.asarray(value, np.float32)  # beyond float32 becomes inf: refused below
        except OverflowError:  # an int beyond float64
            return BAD
        if not np.isfinite(arr).all():
            return BAD
        return arr.tolist() if as_list else _frozen(arr)
    if kind == "float_list":
        return _float_list(value, feature.precision == "float32")
    if kind == "int_list":
        ok = all(isinstance(v, int) and not isinstance(v, bool) and INT64_MIN <= v <= INT64_MAX for v in value)
    else:
        ok = all(isinstance(v, str) for v in value)
    return value if ok else BAD
