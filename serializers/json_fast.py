"""Canonical JSON text of a whole column, faster where its type allows, byte for byte what
:func:`serializers.json_value.canonical` writes (tests/test_json_fast.py compares the two on
random and hostile values).

Two fast ways, and the reference for every row neither vouches for:

- a **struct of strings, integers (within int64) and booleans**: the text built with Arrow
  compute, a column at a time (keys in code-point order, strings escaped for ``"`` and
  ``\\``); a row whose strings hold a control character (escaped otherwise) goes to the
  reference;
- a **string column of JSON texts**: parsed by orjson and written back by it with sorted
  keys, when the value holds no float (the format spells numbers its own way), no integer
  beyond int64, nesting within :data:`~serializers.json_value.MAX_DEPTH`, and the text no
  ``\\u`` escape; a duplicate key (which orjson would keep silently) is caught by counting
  the text's colons against the keys and the colons in strings read, and sends the row to
  the reference, which refuses it.

Any other type, and any row over ``max_bytes``, is the reference's. orjson writes what
Python's ``json.dumps(ensure_ascii=False)`` writes for every string (control characters
included) and sorts keys by UTF-8 bytes, which is code-point order.
"""

from __future__ import annotations

from json.encoder import encode_basestring

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from serializers.json_value import INT64_MAX, INT64_MIN, MAX_DEPTH

_INTS = (pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32())
_CONTROL = "[\\x00-\\x1f]"


def struct_texts(arr: pa.StructArray) -> tuple[pa.Array, pa.Array] | None:
    """(canonical texts as a string array, which rows the reference must write) of a struct
    column of scalar fields; None when the type is not one this path writes."""
    t = arr.type
    names = [t.field(i).name for i in range(t.num_fields)]
    if not names or len(set(names)) != len(names):
        return None
    for i in range(t.num_fields):
        ft = t.field(i).type
        if not (pa.types.is_string(ft) or pa.types.is_large_string(ft) or ft in _INTS or pa.types.is_boolean(ft)):
            return None
    children = dict(zip(names, arr.flatten()))
    slow = pa.array([False] * len(arr), pa.bool_())
    parts: list = ["{"]
    for n, name in enumerate(sorted(names)):
        child = children[name]
        if pa.types.is_boolean(child.type):
            text = pc.if_else(child, "true", "false")
        elif pa.types.is_string(child.type) or pa.types.is_large_string(child.type):
            child = child.cast(pa.string())
            slow = pc.or_(slow, pc.fill_null(pc.match_substring_regex(child, _CONTROL), False))
            escaped = pc.replace_substring(pc.replace_substring(child, "\\", "\\\\"), '"', '\\"')
            text = pc.binary_join_element_wise('"', escaped, '"', "")
        else:
            text = child.cast(pa.string())
        parts += [("," if n else "") + encode_basestring(name) + ":", pc.fill_null(text, "null")]
    parts.append("}")
    joined = pc.binary_join_element_wise(*parts, "")
    texts = pc.if_else(arr.is_null(), pa.scalar(None, pa.string()), joined)
    return texts, slow


class Unsure(Exception):
    """The fast path cannot vouch for this value: the reference writes it."""


def _walk(value, depth: int) -> tuple[int, int]:
    """(object keys, colons inside strings) of a parsed value; raises Unsure for anything
    the fast path does not write as the format does."""
    kind = type(value)
    if kind is str:
        return 0, value.count(":")
    if kind is int:
        if not INT64_MIN <= value <= INT64_MAX:
            raise Unsure
        return 0, 0
    if value is None or kind is bool:
        return 0, 0
    if depth >= MAX_DEPTH:
        raise Unsure
    keys = colons = 0
    if kind is dict:
        keys = len(value)
        for key, item in value.items():
            colons += key.count(":")
            k, c = _walk(item, depth + 1)
            keys, colons = keys + k, colons + c
        return keys, colons
    if kind is list:
        for item in value:
            k, c = _walk(item, depth + 1)
            keys, colons = keys + k, colons + c
        return keys, colons
    raise Unsure  # a float: the format's own spelling


def text_canonical(text: str) -> bytes | None:
    """The canonical text of a JSON text (None: the text ``null``); raises Unsure where the
    reference must decide (a float, a bad or unusual text, a duplicate key)."""
    if "\\u" in text:
        raise Unsure
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        raise Unsure from None
    keys, colons = _walk(value, 0)
    if text.count(":") != keys + colons:  # a key given twice (orjson keeps the last one)
        raise Unsure
    return None if value is None else orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
