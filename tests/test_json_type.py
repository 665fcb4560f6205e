"""The ``json`` value type (format 1.1), golden bytes: the reference encoder and decoder,
the column-wise encoder the writers use (the same bytes), the SQL store's JSON object.

Every expected byte string here was written down by hand from serializers/FORMAT.md's
rules (compact text, keys in code-point order, Python's json.dumps string escapes, whole
numbers within int64 in decimal, other numbers as the float rule writes them) and the
Snappy block format, not produced by the code under test.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serializers import FEATURE_TYPES, BadValue, DecodeError, decode, encode
from serializers.batch import FeatureSpec
from serializers.columnar import encode_column, json_texts
from serializers.json_map import encode_json_maps
from serializers.json_value import BadJson, from_parsed

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "value, expected",
    [
        # key order, no whitespace, a whole float written as an int
        ({"b": 1, "a": [1.0, 2.5, None, True, False, "x"]}, b'{"a":[1,2.5,null,true,false,"x"],"b":1}'),
        # a JSON text: parsed, then written the one way (whitespace gone, keys sorted, 3.0 -> 3, 1e16 -> its digits)
        (' { "z" : 1 ,\n "a" : { "c" : 3.0 , "b" : 1e16 } } ', b'{"a":{"b":10000000000000000,"c":3},"z":1}'),
        (b'{"a": [ ]}', b'{"a":[]}'),
        # keys by code point (U+FF61 before U+1F600: UTF-16 order would put the emoji first)
        (
            {"b": 0, "a": 0, "B": 0, "": 0, "aa": 0, "é": 0, "\U0001f600": 0, "\uff61": 0},
            b'{"":0,"B":0,"a":0,"aa":0,"b":0,"\xc3\xa9":0,"\xef\xbd\xa1":0,"\xf0\x9f\x98\x80":0}',
        ),
        # escapes as json.dumps(ensure_ascii=False): quote, backslash, the short forms, other controls as \u00XX; DEL, U+2028, / as is
        (['"\\/\b\f\n\r\t\x01\x1f\x7f\u2028'], b'["\\"\\\\/\\b\\f\\n\\r\\t\\u0001\\u001f\x7f\xe2\x80\xa8"]'),
        # numbers: the float rule for the rest; -0 is 0; int64's ends exactly; past them a float
        (
            [0.1, 1e-07, 1e22, -0.0, 3.0, -12.0, 1e16, 9.2e18, 1e19, 2**63 - 1, -(2**63), 5e-324, 1.7976931348623157e308],
            b"[0.1,1e-07,1e+22,0,3,-12,10000000000000000,9200000000000000000,1e+19,9223372036854775807,-9223372036854775808,"
            b"5e-324,1.7976931348623157e+308]",
        ),
        ("[1E2, 2.50, -0.0, 1e-4, 0.00001]", b"[100,2.5,0,0.0001,1e-05]"),
        # float32 values (Arrow/Spark float columns) in their shortest float32 digits
        ([np.float32(0.1), np.float32(16777217.0), np.float32(1 / 3)], b"[0.1,16777216,0.33333334]"),
        # numpy and Decimal scalars as the numbers they are
        ([np.int64(-5), np.float64(0.5), np.bool_(True), Decimal("2.50"), Decimal("7")], b"[-5,0.5,true,2.5,7]"),
        # top-level scalars: a str is a JSON text, so the string abc is '"abc"'
        ('"abc"', b'"abc"'),
        (7, b"7"),
        (True, b"true"),
        ("-1.5", b"-1.5"),
        ([], b"[]"),
        ({}, b"{}"),
        # nulls: a value that is null, or a text that is null, is not written (as any null)
        (None, None),
        ("null", None),
        (" null ", None),
        ({"a": None}, b'{"a":null}'),
        # tuples are arrays; unicode as UTF-8
        ((1, "日本"), b'[1,"\xe6\x97\xa5\xe6\x9c\xac"]'),
    ],
)
def test_json_golden(value, expected):
    assert encode("json", value) == expected
    assert encode("json", value, compression="none", max_bytes=65536) == expected


@pytest.mark.parametrize(
    "data, value",
    [
        (b'{"a":[1,2.5,null,true,false,"x"],"b":1}', {"a": [1, 2.5, None, True, False, "x"], "b": 1}),
        (b'"abc"', "abc"),
        (b"[]", []),
        # a number is an int when its value is a whole number within int64, whatever its spelling
        (b"[3,3.0,1e+16,10000000000000000,-0,9223372036854775807]", [3, 3, 10**16, 10**16, 0, 2**63 - 1]),
        # else a float: PostgreSQL's JSONB writes 1e+19 out in full, and it reads back as the same float
        (b"[1e+19,10000000000000000000,0.1,1e-07,-9223372036854775809]", [1e19, 1e19, 0.1, 1e-07, -9.223372036854775809e18]),
        (b' {"b" : 1 , "a":2} ', {"b": 1, "a": 2}),  # not canonical, but JSON: read as it is
    ],
)
def test_json_decodes_to_python_values(data, value):
    got = decode("json", data)
    assert got == value
    assert repr(got) == repr(value)  # ints are ints, floats floats, at every depth


def test_integral_floats_read_back_as_ints_in_both_stores():
    """1.0 and 1 are one value: written `1`, read as the int 1 from Redis's text and from JSONB's."""
    for value in ({"x": 1.0}, {"x": 1}, '{"x": 1.0}', '{"x": 1e0}', {"x": Decimal("1.000")}, {"x": np.float32(1)}):
        assert encode("json", value) == b'{"x":1}'
    assert decode("json", b'{"x":1}') == {"x": 1} and type(decode("json", b'{"x":1}')["x"]) is int
    # the SQL store's JSONB, parsed by json.loads, through the same rule
    assert repr(from_parsed({"x": 1.0, "y": 10**19, "z": [2.0, 0.5]})) == repr({"x": 1, "y": 1e19, "z": [2, 0.5]})


def test_nesting_up_to_64_levels():
    deep = "[" * 64 + "]" * 64
    assert encode("json", deep) == deep.encode()
    value: list = []
    for _ in range(63):
        value = [value]
    assert encode("json", value) == deep.encode()
    with pytest.raises(BadJson, match="nested deeper than 64 levels") as info:
        encode("json", "[" * 65 + "]" * 65)
    assert info.value.reason == "JSON nested deeper than 64 levels"
    with pytest.raises(BadJson, match="nested deeper than 64 levels"):
        encode("json", "[" * 5000 + "]" * 5000)  # deeper than Python's parser goes: the same refusal


def test_snappy_only_when_declared():
    text = b'{"a":"b"}'
    assert encode("json", {"a": "b"}) == text  # json is uncompressed by default (lists are not)
    # Snappy raw block: varint(9), then one literal of 9 bytes (tag (9-1)<<2 = 0x20)
    assert encode("json", {"a": "b"}, compression="snappy") == bytes.fromhex("0920") + text
    assert decode("json", bytes.fromhex("0920") + text, compression="snappy") == {"a": "b"}
    long = {"k": "abcd" * 100}
    packed = encode("json", long, compression="snappy")
    assert len(packed) < 60 and decode("json", packed, compression="snappy") == long


def test_max_bytes_caps_the_text_before_compression():
    # {"a":"xxxxx"} is 13 bytes
    assert encode("json", {"a": "xxxxx"}, max_bytes=13) == b'{"a":"xxxxx"}'
    with pytest.raises(BadJson, match=r"JSON larger than 12 bytes \(max_bytes\): 13 bytes") as info:
        encode("json", {"a": "xxxxx"}, max_bytes=12)
    assert info.value.reason == "JSON larger than 12 bytes (max_bytes)"
    # compression does not lift the cap: 408 bytes of text, about 30 stored
    long = {"k": "abcd" * 100}
    assert len(encode("json", long, compression="snappy")) < 60
    with pytest.raises(BadJson, match="JSON larger than 407 bytes"):
        encode("json", long, compression="snappy", max_bytes=407)
    assert encode("json", long, compression="snappy", max_bytes=408) is not None
    # readers hold to it too, before decompressing
    assert decode("json", b'{"a":"xxxxx"}', max_bytes=13) == {"a": "xxxxx"}
    with pytest.raises(DecodeError, match="larger than max_bytes 12"):
        decode("json", b'{"a":"xxxxx"}', max_bytes=12)
    with pytest.raises(DecodeError, match="larger than max_bytes 407"):
        decode("json", encode("json", long, compression="snappy"), compression="snappy", max_bytes=407)
    # the default cap is the definition's: 65,536
    from feature_defs import FeatureDef

    options = FeatureDef(name="j", type="json").options
    assert options == {"compression": "none", "max_bytes": 65536}
    edge = {"k": "x" * (65536 - 8)}  # {"k":"..."}: 8 bytes besides the string
    assert len(encode("json", edge, **options)) == 65536
    with pytest.raises(BadJson, match="JSON larger than 65,536 bytes"):
        encode("json", {"k": "x" * (65536 - 7)}, **options)


@pytest.mark.parametrize(
    "value, reason",
    [
        (float("nan"), "NaN or infinity in JSON"),
        ({"a": float("inf")}, "NaN or infinity in JSON"),
        ([np.float32("-inf")], "NaN or infinity in JSON"),
        ("[NaN]", "NaN or infinity in JSON"),
        ('{"a": Infinity}', "NaN or infinity in JSON"),
        ("[-Infinity]", "NaN or infinity in JSON"),
        ("1e400", "NaN or infinity in JSON"),
        ([Decimal("NaN")], "NaN or infinity in JSON"),
        (2**63, "integer beyond int64 in JSON"),
        ([-(2**63) - 1], "integer beyond int64 in JSON"),
        ("[9223372036854775808]", "integer beyond int64 in JSON"),
        ({1: "a"}, "JSON object key not a string"),
        ({"a": {None: 1}}, "JSON object key not a string"),
        ('{"a": 1, "a": 2}', "duplicate key in a JSON object"),
        ("{", "not JSON text"),
        ("", "not JSON text"),
        ("{'a': 1}", "not JSON text"),
        ("[1,]", "not JSON text"),
        ('"a\tb"', "not JSON text"),  # a raw control character inside a string
        (b"\xff", "not JSON text"),
        ("\ufeff{}", "not JSON text"),  # a byte-order mark
        ('"\\ud800"', "JSON string not valid Unicode (lone surrogate)"),
        (["\udfff"], "JSON string not valid Unicode (lone surrogate)"),
        ({"a": {1, 2}}, "not a JSON value"),
        ([dt.date(2026, 11, 20)], "not a JSON value"),
        ([b"bytes"], "not a JSON value"),
    ],
)
def test_bad_json_is_bad_input_with_a_reason(value, reason):
    with pytest.raises(BadValue) as info:
        encode("json", value)
    assert isinstance(info.value, BadJson) and info.value.reason == reason
    assert str(info.value).startswith(reason)


@pytest.mark.parametrize(
    "data, options, why",
    [
        (b"null", {}, "a top-level null is never written"),
        (b"[NaN]", {}, "NaN is not JSON"),
        (b"[1e400]", {}, "beyond float64"),
        (b"[" + b"9" * 5000 + b"]", {}, "beyond float64"),
        (b'{"a":1,"a":2}', {}, "duplicate key"),
        (b"\xff", {}, "not UTF-8"),
        (b"{", {}, "Expecting"),
        (b"", {}, "Expecting value"),
        (b"[" * 3000 + b"]" * 3000, {}, "nested deeper than the parser goes"),
        (b"\x09\x20{}", {"compression": "snappy"}, "not a Snappy block"),
        (b"\xff\xff\xff\xff\x0f", {"compression": "snappy", "max_bytes": 65536}, "larger than max_bytes 65,536"),
    ],
)
def test_decode_refuses_what_no_writer_writes(data, options, why):
    with pytest.raises(DecodeError, match=re.escape(why)):
        decode("json", data, **options)


STRUCT = pa.struct([("b", pa.float32()), ("a", pa.string()), ("n", pa.list_(pa.int64()))])


@pytest.mark.parametrize(
    "arr, values",
    [
        # JSON texts in a string column, as Feast's Json feature is stored
        (pa.array(['{"x": 1.0}', None, "[1, 2]", '"s"', "null"]), ['{"x": 1.0}', None, "[1, 2]", '"s"', "null"]),
        (pa.array([b'{"x":1}', None], pa.binary()), [b'{"x":1}', None]),
        # a struct (Feast's Struct, and its Map as Parquet stores it), with a float32 field and nulls
        (
            pa.array([{"b": 0.1, "a": "x", "n": [1, 2]}, None, {"b": None, "a": None, "n": []}], STRUCT),
            [{"b": np.float32(0.1), "a": "x", "n": [1, 2]}, None, {"b": None, "a": None, "n": []}],
        ),
        # a map with string keys (Spark's MapType), nested
        (
            pa.array([[("z", {"k": [0.5]}), ("a", None)], None, []], pa.map_(pa.string(), pa.map_(pa.string(), pa.list_(pa.float64())))),
            [{"z": {"k": [0.5]}, "a": None}, None, {}],
        ),
        # arrays of structs, of doubles; plain numbers and booleans
        (pa.array([[{"q": 1}], [], None], pa.list_(pa.struct([("q", pa.int32())]))), [[{"q": 1}], [], None]),
        (pa.array([1.5, None, 3.0]), [1.5, None, 3.0]),
        (pa.array([True, None]), [True, None]),
        (pa.array([Decimal("1.50"), None], pa.decimal128(5, 2)), [Decimal("1.50"), None]),
    ],
)
@pytest.mark.parametrize("compression", ["none", "snappy"])
def test_columnar_matches_scalar(arr, values, compression):
    got, dropped = encode_column("json", arr, compression=compression, max_bytes=1000)
    assert dropped == 0
    assert got.type == pa.binary()
    assert got.to_pylist() == [encode("json", v, compression=compression, max_bytes=1000) for v in values]
    # sliced, as Arrow hands a batch's columns
    tail, _ = encode_column("json", arr.slice(1), compression=compression)
    assert tail.to_pylist() == [encode("json", v, compression=compression) for v in values[1:]]


def test_columnar_golden_and_refusals():
    arr = pa.array([{"b": 0.1, "a": "é", "n": [1]}], STRUCT)
    assert encode_column("json", arr)[0].to_pylist() == [b'{"a":"\xc3\xa9","b":0.1,"n":[1]}']
    texts, problems = json_texts(pa.array(['{"a":1}', "[NaN]", None, '{"a":"' + "x" * 10 + '"}']), max_bytes=12)
    assert texts == [b'{"a":1}', None, None, None]
    assert [p and p.reason for p in problems] == [None, "NaN or infinity in JSON", None, "JSON larger than 12 bytes (max_bytes)"]
    with pytest.raises(BadJson, match="batch row 1"):
        encode_column("json", pa.array(['{"a":1}', "[NaN]"]))
    with pytest.raises(BadJson, match="NaN or infinity"):
        encode_column("json", pa.array([[float("nan")]], pa.list_(pa.float64())))
    with pytest.raises(BadJson, match="JSON object key not a string"):
        encode_column("json", pa.array([[(1, "a")]], pa.map_(pa.int64(), pa.string())))


def test_the_sql_object_holds_the_value_itself():
    """FORMAT.md "SQL layout": a json feature is the JSON value in the features object, not a string holding it."""
    batch = pa.RecordBatch.from_arrays([pa.array([1, 2, 3]), pa.array(['{"b": [1.0, "x\\"y"], "a": {}}', None, '"s"'])], names=["n", "cfg"])
    specs = [FeatureSpec("n", "int"), FeatureSpec("cfg", "json", {"compression": "snappy", "max_bytes": 100})]
    maps, _ = encode_json_maps(batch, specs)
    assert maps.to_pylist() == ['{"n":1,"cfg":{"a":{},"b":[1,"x\\"y"]}}', '{"n":2}', '{"n":3,"cfg":"s"}']


def test_every_place_that_lists_types_knows_json(tmp_path):
    from feature_defs import FeatureDef
    from feature_defs.models import FeatureType
    from jobs.pipeline.gate.checks import _TYPE_NAMES

    assert "json" in FEATURE_TYPES and set(FEATURE_TYPES) == set(FeatureType.__args__) == set(_TYPE_NAMES)
    assert FeatureDef(name="j", type="json").encoding == "json"
    assert FeatureDef(name="j", type="json", compression="snappy").encoding == "json/snappy"
    assert FeatureDef(name="j", type="json", compression="none").encoding == "json"
    with pytest.raises(ValueError, match="unknown feature type 'jsonb'; expected one of .*string_list, json"):
        encode("jsonb", {})
    with pytest.raises(ValueError, match="unknown feature type 'jsonb'"):
        decode("jsonb", b"{}")
    with pytest.raises(ValueError, match="unknown feature type 'jsonb'"):
        encode_column("jsonb", pa.array(["{}"]))

    # definitions: the options and the lock's encodings
    from feature_defs import DEFAULT_DIR, DefinitionError, load_definitions
    from feature_defs.stored_lock import changes, locked, write_lock

    (tmp_path / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    source = "source:\n  name: t\n  entity: consumer\n  location: t\n  layout: wide\n  features:\n"
    (tmp_path / "t.yaml").write_text(source + "    - {name: a, type: json}\n    - {name: b, type: json, compression: snappy}\n")
    defs = load_definitions(tmp_path)
    assert [(f.name, f.encoding, f.options) for f in defs.sources["t"].features] == [
        ("a", "json", {"compression": "none", "max_bytes": 65536}),
        ("b", "json/snappy", {"compression": "snappy", "max_bytes": 65536}),
    ]
    write_lock(tmp_path, locked(defs, None))
    assert "a: {source: t, feature: a, encoding: json}" in (tmp_path / "stored.lock").read_text()
    # max_bytes changes no byte: nothing to record; compression does: refused
    (tmp_path / "t.yaml").write_text(source + "    - {name: a, type: json, max_bytes: 100}\n    - {name: b, type: json}\n")
    with pytest.raises(DefinitionError, match=r"feature 'b': json/snappy -> json: the values stored as json/snappy would be read as json"):
        load_definitions(tmp_path)
    found = changes(load_definitions(tmp_path, check_lock=False), locked(defs, None))
    assert [c.text.split(":")[0] for c in found] == ["json/snappy -> json"]
    # a type no version knows is refused naming the types there are, json among them
    (tmp_path / "t.yaml").write_text(source + "    - {name: a, type: jsonb}\n")
    with pytest.raises(DefinitionError, match=r"t.yaml:7: source.features.0.type: Input should be .*'string_list', 'json' or 'float_list'"):
        load_definitions(tmp_path)


def test_the_format_docs_examples_are_what_the_encoder_writes():
    """serializers/FORMAT.md's table of json examples: each input is stored as the text shown."""
    doc = (ROOT / "serializers" / "FORMAT.md").read_text(encoding="utf-8")
    section = doc.split("\n#### json examples\n", 1)[1].split("\n\n", 2)[1]
    rows = re.findall(r"^\| `(.+?)` \| `(.*?)` \|", section, re.M)
    assert len(rows) >= 8 and len(rows) == section.count("\n") - 1, section
    for text, stored in rows:
        assert encode("json", text) == stored.encode("utf-8"), (text, stored)


def test_a_column_declared_canonical_is_written_as_it_is():
    """The job's writers get canonical text already (its checks made it so): not parsed again, only its size checked.
    Snappy of 7 bytes: varint(7), a literal tag (7-1)<<2 = 0x18, the bytes."""
    arr = pa.array(['{"a":1}', None])
    assert encode_column("json", arr, canonical=True)[0].to_pylist() == [b'{"a":1}', None]
    assert encode_column("json", arr, canonical=True, compression="snappy")[0].to_pylist() == [bytes.fromhex("0718") + b'{"a":1}', None]
    with pytest.raises(BadJson, match="JSON larger than 6 bytes"):
        encode_column("json", arr, canonical=True, max_bytes=6)
    maps, _ = encode_json_maps(pa.RecordBatch.from_arrays([arr], names=["j"]), [FeatureSpec("j", "json", {"canonical": True})])
    assert maps.to_pylist() == ['{"j":{"a":1}}', "{}"]


# ---- fuzzed: seeded, so every run sees the same cases ------------------------------------

FUZZ = settings(max_examples=150, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=8)
)
VALUES = st.recursive(
    LEAVES, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20
)


def _as_read(value):
    """What a reader gets back for ``value``, by FORMAT.md's rule (not the code's): a whole
    number within int64 an int, other numbers floats, keys in code-point order."""
    if isinstance(value, float) and value.is_integer() and -(2.0**63) <= value < 2.0**63:
        return int(value)
    if isinstance(value, dict):
        return {k: _as_read(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_as_read(v) for v in value]
    return value


def test_fuzzed_values_read_back_as_the_rule_says_however_their_text_is_laid_out():
    @FUZZ
    @given(VALUES.filter(lambda v: v is not None), st.sampled_from([None, 0, 2]), st.booleans(), st.sampled_from(["none", "snappy"]))
    def check(value, indent, ascii_escapes, compression):
        stored = encode("json", [value], compression=compression)  # in an array: a top-level str would be a text
        got = decode("json", stored, compression=compression)
        assert repr(got) == repr([_as_read(value)])
        # any layout of the same value as a JSON text: the same bytes (Python writes 1e16 as 1e+16, 3.0 as 3.0)
        text = json.dumps([value], indent=indent, ensure_ascii=ascii_escapes)
        assert encode("json", text, compression=compression) == stored
        assert encode_column("json", pa.array([text, None]), compression=compression)[0].to_pylist() == [stored, None]

    check()


def test_fuzzed_corrupt_bytes_are_refused_with_decode_error_or_read_as_a_value():
    def damage(args):
        data, position, byte, how = args
        position %= len(data)
        if how == "flip":
            return data[:position] + bytes([data[position] ^ (byte or 1)]) + data[position + 1 :]
        return data[:position] if how == "cut" else data[:position] + bytes([byte]) + data[position:]

    @FUZZ
    @given(
        st.one_of(
            st.binary(max_size=40),
            st.tuples(
                VALUES.map(lambda v: encode("json", [v])),
                st.integers(0, 10**6),
                st.integers(0, 255),
                st.sampled_from(["flip", "cut", "insert"]),
            ).map(damage),
        ),
        st.sampled_from(["none", "snappy"]),
    )
    def check(data, compression):
        try:
            value = decode("json", data, compression=compression, max_bytes=1000)
        except DecodeError as exc:
            assert exc.__cause__ is None and re.match(r"cannot decode \d+ bytes as json: ", str(exc)), str(exc)
            return
        # accepted: a value the type holds; written again it reads back the same
        again = encode("json", [value])[1:-1]
        assert decode("json", again) == value

    check()


def test_an_array_of_json_texts_is_the_array_of_their_values_and_each_must_be_one_value():
    # json_text_elements (Feast's Array(Json)): the job's Arrow step, as the Spark UDF calls it
    from jobs.json_values import _canonical_of

    canonical = _canonical_of("aj", 65536, text_elements=True)
    rows = [['{"x": 1.0}', "[2]", None, ' "s" '], [], None, ["1, 2"], ["{"], ['"a"', "NaN"]]
    made = canonical(pa.array(rows, pa.list_(pa.string())))
    texts, problems = made.field("text").to_pylist(), made.field("problem").to_pylist()
    assert texts[:3] == ['[{"x":1},[2],null,"s"]', "[]", None]
    assert problems[:3] == [None, None, None]
    # not one JSON value by itself (spliced in, "1, 2" would be two elements): bad input, shown as read
    assert problems[3].startswith("aj: element 0: ") and texts[3] == '["1, 2"]'
    assert problems[4].startswith("aj: element 0: ") and problems[5].startswith("aj: element 1: ")
    # any other column is read as without the option: an array of strings stays one
    plain = _canonical_of("aj", 65536)(pa.array([["[2]"]], pa.list_(pa.string())))
    assert plain.field("text").to_pylist() == ['["[2]"]']
    structs = canonical(pa.array([[{"a": 1}]], pa.list_(pa.struct([("a", pa.int64())]))))
    assert structs.field("text").to_pylist() == ['[{"a":1}]']
