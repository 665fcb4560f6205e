"""The ``json`` value type (format 1.1): a structured value as canonical JSON text.

One value, one text: compact (no insignificant whitespace), object keys in code-point
order, strings escaped as Python's ``json.dumps(ensure_ascii=False)`` does, UTF-8. A number
whose value is a whole number within int64 (an int, or a float such as ``3.0`` or ``1e16``)
is written in decimal (``3``, ``10000000000000000``); any other number in the ``float``
rule's shortest form (``0.1``, ``1e-07``, ``1e+19``). So every store, and every JSON
library that reformats numbers (PostgreSQL's JSONB writes ``1e+19`` as
``10000000000000000000``), gives back the same value: decoding reads a number as an int
when its value is a whole number within int64, else as a float.

Bad input (:class:`BadJson`, a :class:`~serializers.scalar.BadValue`): NaN and ±inf, an
integer beyond int64, an object key that is not a string, a duplicate key in a JSON text,
text that is not JSON, a lone surrogate (not UTF-8), nesting deeper than
:data:`MAX_DEPTH`, and an encoded text over ``max_bytes``. Each carries a short ``reason``
(what the quarantine counts) besides its message.

No pyarrow here: readers decode without it (the column-wise path is serializers.columnar).
"""

from __future__ import annotations

import json
import math
from decimal import Decimal
from json.encoder import encode_basestring
from typing import Any

import numpy as np

from serializers.errors import BadValue, DecodeError
from serializers.floats import format_float32, format_float64

MAX_DEPTH = 64
"""Arrays and objects nested deeper than this are bad input (the definitions' YAML has the same bound)."""
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_TWO_63 = 2.0**63


class BadJson(BadValue):
    """A value the ``json`` type cannot hold; ``reason`` is its kind, the same text for every such value."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


NOT_JSON = "not JSON text"
NOT_FINITE = "NaN or infinity in JSON"
BEYOND_INT64 = "integer beyond int64 in JSON"
DUPLICATE_KEY = "duplicate key in a JSON object"
KEY_NOT_STRING = "JSON object key not a string"
TOO_DEEP = f"JSON nested deeper than {MAX_DEPTH} levels"
NOT_UTF8 = "JSON string not valid Unicode (lone surrogate)"
NOT_A_VALUE = "not a JSON value"


def too_large(max_bytes: int) -> str:
    return f"JSON larger than {max_bytes:,} bytes (max_bytes)"


def _number(x: float, float32: bool = False) -> str:
    if not math.isfinite(x):
        raise BadJson(NOT_FINITE, repr(x))
    if x.is_integer() and -_TWO_63 <= x < _TWO_63:
        return str(int(x))  # exact: a whole float is an integer
    return format_float32(x) if float32 else format_float64(x)


def _write(value: Any, out: list[str], depth: int) -> None:
    # Ordered by how often each kind turns up in a document.
    if isinstance(value, str):
        out.append(encode_basestring(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise BadJson(BEYOND_INT64, str(value) if value.bit_length() < 256 else f"{value.bit_length()} bits")
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(_number(value))
    elif isinstance(value, dict):
        if depth >= MAX_DEPTH:
            raise BadJson(TOO_DEEP)
        if not value:
            out.append("{}")
            return
        for key in value:
            if not isinstance(key, str):
                raise BadJson(KEY_NOT_STRING, repr(key)[:40])
        out.append("{")
        for i, key in enumerate(sorted(value)):
            if i:
                out.append(",")
            out.append(encode_basestring(key))
            out.append(":")
            _write(value[key], out, depth + 1)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        if depth >= MAX_DEPTH:
            raise BadJson(TOO_DEEP)
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out, depth + 1)
        out.append("]")
    elif isinstance(value, np.floating):
        out.append(_number(float(value), float32=value.dtype.itemsize <= 4))
    elif isinstance(value, np.bool_):
        out.append("true" if value else "false")
    elif isinstance(value, np.integer):
        _write(int(value), out, depth)
    elif isinstance(value, Decimal):
        if not value.is_finite():
            raise BadJson(NOT_FINITE, str(value))
        whole = value == value.to_integral_value()
        _write(int(value) if whole and INT64_MIN <= value <= INT64_MAX else float(value), out, depth)
    else:
        raise BadJson(NOT_A_VALUE, type(value).__name__)


def _pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise BadJson(DUPLICATE_KEY, repr(key)[:40])
    return out


def _constant(name: str) -> float:
    raise BadJson(NOT_FINITE, name)


def parse_text(text: str | bytes) -> Any:
    """A JSON text (RFC 8259) as a Python value, refusing what the type cannot hold:
    NaN/Infinity, a duplicate key. Numbers as Python's json reads them (exact ints)."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise BadJson(NOT_JSON, f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        return json.loads(text, object_pairs_hook=_pairs, parse_constant=_constant)
    except BadJson:
        raise
    except RecursionError:
        raise BadJson(TOO_DEEP) from None
    except ValueError as exc:  # json.JSONDecodeError, or int()'s digit limit
        raise BadJson(NOT_JSON, str(exc)[:120]) from None


def canonical(value: Any, max_bytes: int | None = None) -> bytes | None:
    """The canonical UTF-8 JSON text of ``value``; None for null (not written).

    ``value``: a dict (string keys), list or tuple, str, int, float, bool, None, numpy
    scalars (a ``numpy.float32`` in its shortest float32 digits) or Decimal, nested as
    JSON nests; at the top level a ``str`` or ``bytes`` is a JSON *text*, parsed first
    (``'"abc"'`` is the string abc; a text ``null`` is null). Raises :class:`BadJson`."""
    if isinstance(value, (str, bytes, bytearray, memoryview)):
        value = parse_text(value)
    return canonical_value(value, max_bytes)


def canonical_value(value: Any, max_bytes: int | None = None) -> bytes | None:
    """As :func:`canonical`, but a top-level ``str`` is a JSON string, not a text to parse
    (what :func:`decode` returned for ``"abc"`` is written back as ``"abc"``)."""
    if value is None:
        return None
    out: list[str] = []
    _write(value, out, 0)
    try:
        data = "".join(out).encode("utf-8")
    except UnicodeEncodeError:
        raise BadJson(NOT_UTF8) from None
    if max_bytes is not None and len(data) > max_bytes:
        raise BadJson(too_large(max_bytes), f"{len(data):,} bytes")
    return data


# -- decoding -------------------------------------------------------------------------


def snappy_length(block: bytes) -> int | None:
    """The uncompressed length a Snappy raw block declares (its leading varint, at most 5
    bytes); None when it declares none. Read before decompressing, to refuse a large one."""
    length = 0
    for i, byte in enumerate(block[:5]):
        length |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return length
    return None


def _int(text: str) -> int | float:
    if len(text) <= 18:  # the common case: within int64 by its digits
        return int(text)
    value = float(text) if len(text) > 4000 else int(text)  # int() refuses over 4,300 digits
    if isinstance(value, int) and INT64_MIN <= value <= INT64_MAX:
        return value
    value = float(value)  # an integral value beyond int64 reads as a float (PostgreSQL writes 1e+19 out in full)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:24]}... beyond float64")
    return value


def _float(text: str) -> int | float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:24]} beyond float64")
    if value.is_integer() and -_TWO_63 <= value < _TWO_63:
        exact = Decimal(text)
        if exact == exact.to_integral_value():
            return int(exact)  # a whole number within int64, whatever its spelling
    return value


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def _decode_pairs(pairs: list[tuple[str, Any]]) -> dict:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key in an object")
    return out


def decode(data: bytes, max_bytes: int | None = None) -> Any:
    """The value of a stored JSON text (decompressed already). Numbers: a whole value within
    int64 is an int (``3``, ``3.0``, ``1e+16`` alike), any other a float. Raises
    :class:`DecodeError` for anything no writer produces: not UTF-8 JSON, NaN/Infinity or a
    number beyond float64, a duplicate key, a top-level null, more than ``max_bytes``."""
    if max_bytes is not None and len(data) > max_bytes:
        raise DecodeError(f"cannot decode {len(data)} bytes as json: larger than max_bytes {max_bytes}")
    try:
        text = data.decode("utf-8")
        value = json.loads(text, parse_int=_int, parse_float=_float, parse_constant=_no_constant, object_pairs_hook=_decode_pairs)
    except UnicodeDecodeError as exc:
        raise DecodeError(f"cannot decode {len(data)} bytes as json: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:
        raise DecodeError(f"cannot decode {len(data)} bytes as json: nested deeper than the parser goes") from None
    except ValueError as exc:
        raise DecodeError(f"cannot decode {len(data)} bytes as json: {str(exc)[:120]}") from None
    if value is None:
        raise DecodeError(f"cannot decode {len(data)} bytes as json: a top-level null is never written")
    return value


def _normal(value: Any) -> Any:
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        if INT64_MIN <= value <= INT64_MAX:
            return value
        value = float(value)  # OverflowError beyond float64
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("NaN or infinity")
        return int(value) if value.is_integer() and -_TWO_63 <= value < _TWO_63 else value
    if isinstance(value, dict):  # keys in the stored text's order (JSONB keeps its own)
        return {k: _normal(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    raise ValueError(f"not a JSON value: {type(value).__name__}")


def from_parsed(value: Any) -> Any:
    """A value a JSON parser read from elsewhere (the SQL store's JSONB, parsed with
    ``json.loads``) as :func:`decode` reads the canonical text: a whole number within int64
    an int, any other number a float, object keys in code-point order. Raises ValueError for
    what no writer stores (null, NaN/inf, a number beyond float64)."""
    if value is None:
        raise ValueError("a top-level null is never written")
    try:
        return _normal(value)
    except OverflowError:
        raise ValueError("a number beyond float64") from None
    except RecursionError:
        raise ValueError("nested deeper than the parser goes") from None
