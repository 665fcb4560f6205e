"""The fast ways to canonical JSON (serializers/json_fast.py) against the reference
(serializers/json_value.py): the same bytes, or the same refusal, for random and hostile values."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from serializers import json_value
from serializers.columnar import _reference_texts, json_text_column
from serializers.json_fast import Unsure, struct_texts, text_canonical

# strings with what JSON escapes, what it does not, and non-ASCII beyond the BMP
ANY_CHAR = st.characters(codec="utf-8")
NASTY = st.sampled_from(['"', "\\", ":", "\x00", "\x1f", "\x7f", "\u2028", "é", "\U0001f600", "/", "\n", "\t", " "])
TEXT = st.lists(st.one_of(ANY_CHAR, NASTY), max_size=12).map("".join)
EDGES = [json_value.INT64_MAX, json_value.INT64_MAX + 1, json_value.INT64_MIN, json_value.INT64_MIN - 1, 2**64 - 1, 0]
INT = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from(EDGES))
SCALAR = st.one_of(st.none(), st.booleans(), INT, st.floats(allow_nan=True, allow_infinity=True), TEXT)
VALUE = st.recursive(SCALAR, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)), max_leaves=12)


def reference(text):
    try:
        return json_value.canonical(text), None
    except json_value.BadJson as exc:
        return None, exc.reason


def fast(text, max_bytes=None):
    [made], problems = _reference_texts_of([text], max_bytes)
    return made, problems


def _reference_texts_of(texts, max_bytes=None):
    made, problems = json_text_column(pa.array(texts, pa.string()), max_bytes)
    return made.to_pylist(), None if problems is None else problems[0].reason


def _layouts(value):
    """The ways a producer may write one value: compact, spaced, keys sorted or not, ASCII-escaped or not."""
    out = []
    for kwargs in ({}, {"separators": (",", ":")}, {"sort_keys": True, "indent": 1}, {"ensure_ascii": True}):
        try:
            out.append(json.dumps(value, **{"ensure_ascii": False, **kwargs}))
        except ValueError:
            pass
    return out


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(VALUE)
def test_a_json_text_is_written_as_the_reference_writes_it(value):
    for text in _layouts(value):
        assert fast(text) == reference(text), text


HOSTILE = [
    '{"a":1,"a":2}',  # a duplicate key: orjson keeps the last one silently
    '{"a":1,"a":"\\u003a"}',  # a duplicate hidden by an escaped colon
    '{"a:b":1,"a:b":2}',
    '{"a":{"b":1,"b":1}}',
    '[{"x":1},{"x":1,"x":1}]',
    '{"k":"::","k":"::"}',
    "\ufeff{}",  # a byte-order mark
    "[NaN]",
    "[Infinity]",
    "-Infinity",
    "[1e400]",
    "1e-400",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "123456789012345678901234567890",
    "-0",
    "0.0",
    "-0.0",
    "1e2",
    "1E+2",
    "3.0",
    "0.1",
    "1.5e300",
    "01",
    "1.",
    ".5",
    "+1",
    "--1",
    "[1,]",
    "{,}",
    '{"a" 1}',
    "",
    " ",
    "nul",
    "null",
    " null ",
    "true",
    "false",
    '"abc"',
    '"\\ud800"',
    '"\\udc00\\ud800"',
    '"\\ud83d\\ude00"',
    '"\x01"',
    '"a\tb"',
    '"\\u0000"',
    '"\\/"',
    "[" * 64 + "]" * 64,
    "[" * 65 + "]" * 65,
    '{"a":' * 64 + "1" + "}" * 64,
    '{"a":' * 65 + "1" + "}" * 65,
    "[1] [2]",
    "[1]x",
    "{}",
    "[]",
    '{"":0}',
    '{"\\"":1,"\\\\":2}',
    '{"b":1,"a":{"d":[true,null],"c":"é"}}',
    " \t\n\r[1]\r\n",
    "\x0b[1]",
    "\xa0[1]",
    '{"a":1}\x00',
]


@pytest.mark.parametrize("text", HOSTILE)
def test_hostile_texts_are_written_or_refused_as_the_reference_does(text):
    assert fast(text) == reference(text)


def test_what_the_fast_way_refuses_to_vouch_for():
    for text in ['{"a":1,"a":2}', "[1.5]", "9223372036854775808", '"\\u00e9"', "[" * 65 + "]" * 65, "[NaN]"]:
        with pytest.raises(Unsure):
            text_canonical(text)
    assert text_canonical('{ "b": [1, "x:y"], "a": null }') == b'{"a":null,"b":[1,"x:y"]}'
    assert text_canonical("null") is None


def test_max_bytes_is_the_references():
    text = '{"a": "' + "x" * 20 + '"}'  # canonical: 28 bytes
    assert fast(text, 28) == (b'{"a":"' + b"x" * 20 + b'"}', None)
    assert fast(text, 27) == (None, json_value.too_large(27))


FIELD_TYPES = {
    "s": (pa.string(), TEXT),
    "i": (pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    "i8": (pa.int8(), st.integers(-128, 127)),
    "u32": (pa.uint32(), st.integers(0, 2**32 - 1)),
    "b": (pa.bool_(), st.booleans()),
}


@st.composite
def struct_columns(draw):
    names = draw(st.lists(st.one_of(TEXT, st.sampled_from(["z", "a", "é", '"q"', "a:b"])), min_size=1, max_size=5, unique=True))
    kinds = [draw(st.sampled_from(sorted(FIELD_TYPES))) for _ in names]
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 5)) == 0:
            rows.append(None)
        else:
            rows.append({n: draw(st.one_of(st.none(), FIELD_TYPES[k][1])) for n, k in zip(names, kinds)})
    return pa.array(rows, pa.struct([(n, FIELD_TYPES[k][0]) for n, k in zip(names, kinds)]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(struct_columns(), st.sampled_from([None, 8, 40, 1 << 16]))
@example(pa.array([{"b": "x\x01", "a": 1}, None, {"b": 'q"\\', "a": None}], pa.struct([("b", pa.string()), ("a", pa.int64())])), None)
def test_a_struct_column_is_written_as_the_reference_writes_it(column, max_bytes):
    made, problems = json_text_column(column, max_bytes)
    texts, reasons = _reference_texts(column, max_bytes)
    assert made.to_pylist() == texts
    reason = lambda p: None if p is None else p.reason  # noqa: E731
    assert [reason(p) for p in (problems or [None] * len(column))] == [reason(p) for p in reasons]


def test_structs_the_fast_way_leaves_to_the_reference():
    nested = pa.array([{"a": {"b": 1}}], pa.struct([("a", pa.struct([("b", pa.int64())]))]))
    floats = pa.array([{"a": 1.5}], pa.struct([("a", pa.float64())]))
    big = pa.array([{"a": 2**64 - 1}], pa.struct([("a", pa.uint64())]))  # beyond int64: refused by the reference
    for column in (nested, floats, big):
        assert struct_texts(column) is None
    made, problems = json_text_column(big)
    assert made.to_pylist() == [None] and problems[0].reason == json_value.BEYOND_INT64
    made, _ = json_text_column(pa.array([{"b": "x\x1f", "a": True}], pa.struct([("b", pa.string()), ("a", pa.bool_())])))
    assert made.to_pylist() == [b'{"a":true,"b":"x\\u001f"}']  # a control character: the reference's escape


def test_texts_that_repeat_are_written_alike_from_the_memo():
    texts = ['{"b": 1, "a": 2}', "[NaN]", '{"b": 1, "a": 2}', None, "[1.5]", '{"a":1,"a":1}'] * 400
    for max_bytes in (None, 8, None):  # the memo keeps each max_bytes's answers apart
        made, problems = json_text_column(pa.array(texts, pa.string()), max_bytes)
        expected = [(None, None) if t is None else reference_with(t, max_bytes) for t in texts]
        assert list(zip(made.to_pylist(), [None if p is None else p.reason for p in problems])) == expected


def reference_with(text, max_bytes):
    try:
        return json_value.canonical(text, max_bytes), None
    except json_value.BadJson as exc:
        return None, exc.reason
