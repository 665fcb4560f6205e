"""Golden bytes of the online format, and the column-wise encoder against the scalar one.

Every expected byte string here was written down from the format's rules
(serializers/FORMAT.md), the published xxh32 test vectors, the protobuf wire format and the
Snappy block format, not produced by the code under test.
"""

from __future__ import annotations

import math
import random
import struct

import numpy as np
import pyarrow as pa
import pytest

from serializers import FEATURE_TYPES, BadValue, DecodeError, decode, encode, field_id, field_id_int
from serializers.columnar import encode_column


def test_field_id_matches_published_xxh32_vectors():
    assert field_id_int("") == 0x02CC5D05
    assert field_id_int("a") == 0x550D7456
    assert field_id_int("abc") == 0x32D153FF
    assert field_id("abc") == bytes.fromhex("ff53d132")  # little-endian


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.0, b"0"),
        (-0.0, b"0"),
        (0.1, b"0.1"),
        (1e-7, b"1e-07"),
        (1e22, b"1e+22"),
        (3.0, b"3"),
        (-12.0, b"-12"),
        (2.5, b"2.5"),
        (0.0001, b"0.0001"),
        (0.00001, b"1e-05"),
        (1e15, b"1000000000000000"),
        (1e16, b"1e+16"),
        (123456789012345.67, b"123456789012345.67"),
        (5e-324, b"5e-324"),
        (1.7976931348623157e308, b"1.7976931348623157e+308"),
        (-2.2250738585072014e-308, b"-2.2250738585072014e-308"),
        (float("nan"), None),
        (float("inf"), None),
        (float("-inf"), None),
        (None, None),
    ],
)
def test_float64_golden(value, expected):
    assert encode("float", value) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (0.1, b"0.1"),  # the float32 nearest 0.1 prints as 0.1, not 0.10000000149011612
        (1 / 3, b"0.33333334"),
        (16777217.0, b"16777216"),
        (1e-7, b"1e-07"),
        (3.4028234663852886e38, b"3.4028235e+38"),
        (1e39, None),  # overflows float32: not written
        (-0.0, b"0"),
        (123456.789, b"123456.79"),
    ],
)
def test_float32_golden(value, expected):
    assert encode("float", value, precision="float32") == expected


@pytest.mark.parametrize(
    "feature_type, value, options, expected",
    [
        ("int", 0, {}, b"0"),
        ("int", -42, {}, b"-42"),
        ("int", 2**63 - 1, {}, b"9223372036854775807"),
        ("int", -(2**63), {}, b"-9223372036854775808"),
        ("bool", True, {}, b"1"),
        ("bool", False, {}, b"0"),
        ("string", "", {}, b""),
        ("string", "日本", {}, bytes.fromhex("e697a5e69cac")),
        ("string", "café", {"max_length": 4}, b"caf\xc3\xa9"),
        # Embedding: tag 0x0a, length 8, two little-endian float32 values
        ("embedding", [1.0, -0.0], {"dimension": 2}, bytes.fromhex("0a080000803f00000080")),
        # IntList, packed varints: 1 -> 01, 300 -> ac02, -1 -> ten bytes ff..ff01
        ("int_list", [1, 300, -1], {"compression": "none"}, bytes.fromhex("0a0d01ac02ffffffffffffffffff01")),
        # Snappy raw block: varint(15) then one literal of 15 bytes (tag (15-1)<<2 = 0x38)
        ("int_list", [1, 300, -1], {}, bytes.fromhex("0f380a0d01ac02ffffffffffffffffff01")),
        ("int_list", [], {"compression": "none"}, b""),
        ("int_list", [], {}, b"\x00"),  # Snappy of nothing: varint(0)
        ("string_list", ["a", ""], {"compression": "none"}, bytes.fromhex("0a01610a00")),
        ("string_list", [], {"compression": "none"}, b""),
        # FloatList, packed doubles: tag 0x0a, length 16, 1.0 = 3ff0000000000000 and 0.5 = 3fe0000000000000 little-endian
        ("float_list", [1.0, 0.5], {}, bytes.fromhex("0a10000000000000f03f000000000000e03f")),
        # Snappy (declared): varint(18), one literal of 18 bytes (tag (18-1)<<2 = 0x44)
        ("float_list", [1.0, 0.5], {"compression": "snappy"}, bytes.fromhex("12440a10000000000000f03f000000000000e03f")),
        # -2.5 = c004000000000000, 1e-07 = 3e7ad7f29abcaf48, 3.0 = 4008000000000000
        ("float_list", [-2.5, 1e-07, 3.0], {}, bytes.fromhex("0a1800000000000004c048afbc9af2d77a3e0000000000000840")),
        # 16 values: 128 bytes, whose length takes two varint bytes (80 01)
        ("float_list", [0.0] * 16, {}, bytes.fromhex("0a8001") + bytes(128)),
        ("float_list", [], {}, b""),
        ("float_list", [], {"compression": "snappy"}, b"\x00"),
    ],
)
def test_golden_bytes(feature_type, value, options, expected):
    assert encode(feature_type, value, **options) == expected
    assert decode(feature_type, expected, **options) == value


def test_float32_list_golden_bytes():
    # Float32List, packed float32 (Embedding's layout): 1.0 = 3f800000, the float32 nearest 0.1 = 3dcccccd
    expected = bytes.fromhex("0a080000803fcdcccc3d")
    assert encode("float_list", [1.0, 0.1], precision="float32") == expected
    assert decode("float_list", expected, precision="float32") == [1.0, struct.unpack("<f", bytes.fromhex("cdcccc3d"))[0]]
    # a float32 list is never read as a float64 one: 8 bytes are one double there
    assert decode("float_list", expected) == [struct.unpack("<d", bytes.fromhex("0000803fcdcccc3d"))[0]]


def test_float_list_decoding_refuses_what_no_writer_writes():
    nan, inf = bytes.fromhex("000000000000f87f"), bytes.fromhex("000000000000f07f")
    for data, options in [
        (b"\x0a\x08" + nan, {}),
        (b"\x0a\x10" + bytes(8) + inf, {}),
        (b"\x0a\x04" + bytes.fromhex("0000807f"), {"precision": "float32"}),  # float32 +inf
        (b"\x0a\x10" + bytes(8), {}),  # truncated
        (bytes.fromhex("0a10000000000000f03f000000000000e03f"), {"compression": "snappy"}),  # not a Snappy block
    ]:
        with pytest.raises(DecodeError, match="cannot decode .* as float_list"):
            decode("float_list", data, **options)


def test_every_place_that_lists_types_knows_float_list():
    from feature_defs import FeatureDef
    from feature_defs.models import FeatureType
    from jobs.pipeline.gate.checks import _TYPE_NAMES
    from jobs.pipeline.gate.scan import LISTS

    assert "float_list" in FEATURE_TYPES and set(FEATURE_TYPES) == set(FeatureType.__args__) == set(_TYPE_NAMES)
    assert "float_list" in LISTS  # profiled for its lengths
    # the encodings stored.lock and the stores' description record (FORMAT.md): the defaults unnamed, as json's
    encodings = {
        (None, None): "float_list",
        ("float64", "none"): "float_list",
        ("float32", None): "float_list/float32",
        (None, "snappy"): "float_list/snappy",
        ("float32", "snappy"): "float_list/float32/snappy",
    }
    for (precision, compression), encoding in encodings.items():
        feature = FeatureDef(name="v", type="float_list", precision=precision, compression=compression)
        assert feature.encoding == encoding
        assert feature.options == {"compression": compression or "none", **({"precision": precision} if precision else {})}
    for option in ({"dimension": 4}, {"max_bytes": 10}, {"min_value": 0}):
        with pytest.raises(ValueError, match=f"option '{next(iter(option))}' does not apply to type float_list"):
            FeatureDef(name="v", type="float_list", **option)


def test_snappy_pays_off_on_long_repeated_lists():
    values = [7, 7, 7, 7, 12, 12, 12, 12] * 20
    raw = encode("int_list", values, compression="none")
    packed = encode("int_list", values)
    assert len(packed) < len(raw) / 3
    assert decode("int_list", packed) == values


@pytest.mark.parametrize(
    "feature_type, value, options, message",
    [
        ("embedding", [1.0, 2.0], {"dimension": 3}, "declared dimension is 3"),
        ("embedding", [1.0, float("nan")], {"dimension": 2}, "not a finite number"),
        ("string", "x" * 5, {"max_length": 4}, "longer than max_length 4"),
        ("int", 2**63, {}, "outside int64"),
        ("int_list", [1, None], {}, "null element"),
        ("string_list", ["a", None], {}, "null element"),
        ("float_list", [1.0, None], {}, "null element in float_list"),
        ("float_list", [1.0, float("nan")], {}, "float_list element nan is not a finite number"),
        ("float_list", [float("-inf")], {"compression": "snappy"}, "float_list element -inf is not a finite number"),
        ("float_list", [1e39], {"precision": "float32"}, "float_list element 1e\\+39 is beyond float32 range"),
    ],
)
def test_bad_values_raise_named_errors(feature_type, value, options, message):
    with pytest.raises(BadValue, match=message):
        encode(feature_type, value, **options)


ARROW_TYPES = {
    "float": pa.float64(),
    "int": pa.int64(),
    "bool": pa.bool_(),
    "string": pa.string(),
    "embedding": pa.list_(pa.float32()),
    "int_list": pa.list_(pa.int64()),
    "string_list": pa.list_(pa.string()),
    "float_list": pa.list_(pa.float64()),
}

EDGE_CASES = [
    (
        "float",
        {},
        [0.0, -0.0, 0.1, 1e-7, 1e22, 1e15, 1e16, 3.0, -12.0, 5e-324, 1.7976931348623157e308, 1e-4, 1e-5, None, float("nan"), float("-inf")],
    ),
    ("float", {"precision": "float32"}, [0.1, 1 / 3, 1e-7, 3.4e38, 1e39, -0.0, None, 16777217.0, 1e-45]),
    ("int", {}, [0, -1, 2**63 - 1, -(2**63), None]),
    ("bool", {}, [True, False, None]),
    ("string", {}, ["", "é", "日本語", "x" * 300, None]),
    ("embedding", {"dimension": 3}, [[0.0, -0.0, 1.5], None, [1e-7, 3.4e38, -2.0]]),
    ("int_list", {}, [[], [1, 1, 1, 2, 2], None, [-1, 2**63 - 1, -(2**63), 300], list(range(2000))]),
    ("int_list", {"compression": "none"}, [[], [5], None, [-(2**63)] * 3]),
    ("string_list", {}, [[], ["a", "bb", ""], None, ["x" * 200, "日本"]]),
    ("string_list", {"compression": "none"}, [[], ["é"], None]),
    ("float_list", {}, [[], [1.0, 0.5], None, [-0.0, 5e-324, 1.7976931348623157e308, 1e-7], [i / 7 for i in range(2000)], [3.0] * 16]),
    ("float_list", {"compression": "snappy"}, [[], [1.0, 0.5], None, [0.25] * 300]),
    ("float_list", {"precision": "float32"}, [[0.1, 1 / 3], [], None, [3.4e38, -1e-45, 16777217.0], [i / 3 for i in range(40)]]),
    ("float_list", {"precision": "float32", "compression": "snappy"}, [[0.1], None, []]),
]


@pytest.mark.parametrize("feature_type, options, values", EDGE_CASES)
def test_columnar_matches_scalar_on_edge_cases(feature_type, options, values):
    arrow_type = ARROW_TYPES[feature_type]
    if options.get("precision") == "float32":
        arrow_type = pa.list_(pa.float32()) if feature_type == "float_list" else pa.float32()
    column, non_finite = encode_column(feature_type, pa.array(values, arrow_type), **options)
    assert column.to_pylist() == [encode(feature_type, v, **options) for v in values]
    if feature_type == "float" and not options:
        assert non_finite == 2  # nan and -inf


def test_columnar_float_list_takes_any_numbers_and_refuses_bad_elements():
    # float32 elements widened, integers as floats: the same bytes as the floats themselves
    column, _ = encode_column("float_list", pa.array([[0.5, 0.1], None], pa.list_(pa.float32())))
    assert column.to_pylist() == [
        bytes.fromhex("0a10000000000000e03f") + struct.pack("<d", struct.unpack("<f", struct.pack("<f", 0.1))[0]),
        None,
    ]
    column, _ = encode_column("float_list", pa.array([[1, -2]], pa.list_(pa.int64())))
    assert column.to_pylist() == [bytes.fromhex("0a10000000000000f03f00000000000000c0")]  # 1.0, -2.0
    # a slice: its own rows' elements only
    column, _ = encode_column("float_list", pa.array([[9.0, 8.0], [1.0, 0.5], None, [], [7.0]]).slice(1, 3))
    assert column.to_pylist() == [bytes.fromhex("0a10000000000000f03f000000000000e03f"), None, b""]
    for values, arrow_type, options, message in [
        ([[1.0], [2.0, None]], pa.float64(), {}, "null element in float_list"),
        ([[1.0, float("nan")]], pa.float64(), {}, "float_list element is not a finite number"),
        ([[float("inf")]], pa.float32(), {"precision": "float32"}, "float_list element is not a finite number"),
        ([[1.0], [1e39]], pa.float64(), {"precision": "float32"}, "float_list element is beyond float32 range"),
    ]:
        with pytest.raises(BadValue, match=message):
            encode_column("float_list", pa.array(values, pa.list_(arrow_type)), **options)


def test_columnar_matches_scalar_on_random_floats():
    rng = random.Random(7)
    values = []
    for _ in range(50_000):
        kind = rng.random()
        if kind < 0.4:
            values.append(round(rng.uniform(-1000, 1000), rng.randint(0, 4)))
        elif kind < 0.7:
            values.append(rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30))
        else:
            (v,) = struct.unpack("<d", rng.randbytes(8))
            values.append(v)
    arr = pa.array(values, pa.float64())
    for options in ({}, {"precision": "float32"}):
        column, _ = encode_column("float", arr, **options)
        assert column.to_pylist() == [encode("float", v, **options) for v in values]


def test_columnar_handles_sliced_arrays():
    arr = pa.array([[1, 2], [3], None, [4, 5, 6]], pa.list_(pa.int64())).slice(1, 3)
    column, _ = encode_column("int_list", arr)
    assert column.to_pylist() == [encode("int_list", v) for v in ([3], None, [4, 5, 6])]
    strings = pa.array([["x", "yy"], None, ["é", ""], ["zzz"]], pa.list_(pa.string())).slice(1, 3)
    column, _ = encode_column("string_list", strings, compression="none")
    assert column.to_pylist() == [None, bytes.fromhex("0a02c3a90a00"), bytes.fromhex("0a037a7a7a")]
    # floats: the exponent scan of Arrow's text must look at the slice's rows only
    floats = pa.array([1e-7, 0.5, 123456789012345.6, -0.0, 2.5, 1e300]).slice(1, 4)
    column, _ = encode_column("float", floats)
    assert column.to_pylist() == [b"0.5", b"123456789012345.6", b"0", b"2.5"]


def test_float_text_round_trips():
    rng = np.random.default_rng(3)
    for v in rng.standard_normal(2000) * 10.0 ** rng.integers(-10, 10, 2000):
        assert float(encode("float", float(v))) == v
        assert np.float32(float(encode("float", float(v), precision="float32"))) == np.float32(v)


@pytest.mark.parametrize("feature_type", ["int", "bool", "embedding", "int_list", "string_list", "float", "string", "float_list"])
def test_decoders_reject_garbage_with_decode_error(feature_type):
    rng = random.Random(11)
    options = {"dimension": 4} if feature_type == "embedding" else {}
    for _ in range(300):
        data = rng.randbytes(rng.randint(0, 40))
        try:
            decode(feature_type, data, **options)
        except DecodeError:
            pass  # the only acceptable failure


def test_decode_bool_is_strict():
    with pytest.raises(DecodeError):
        decode("bool", b"2")
    assert math.isclose(decode("float", b"1e-07"), 1e-7)


def test_key_and_field_rules():
    """serializers.keys against the format's rules, written down here (FORMAT.md "Key", "Freshness field")."""
    import calendar
    import datetime as dt

    from serializers import keys

    assert keys.key_prefix("c") == "c:" and keys.key_prefix("c", "blue") == "blue:c:"
    assert keys.entity_id(42) == "42" and keys.entity_id(7, "NYC") == "7:NYC" and keys.entity_id(-3, 0) == "-3:0"
    assert keys.redis_key("blue:c:", "7:NYC") == b"blue:c:7:NYC"
    assert keys.redis_key("c:", "caf\u00e9") == b"c:caf\xc3\xa9"
    assert keys.freshness_field_name("consumer_daily") == "_ts:consumer_daily"
    assert keys.freshness_field("consumer_daily") == struct.pack("<I", field_id_int("_ts:consumer_daily"))
    # the end of the date, UTC: 2026-11-21T00:00:00Z for 2026-11-20
    assert keys.as_of_epoch(dt.date(2026, 11, 20)) == calendar.timegm((2026, 11, 21, 0, 0, 0)) == 1795219200
    assert keys.as_of_epoch(dt.date(2024, 2, 28)) == calendar.timegm((2024, 2, 29, 0, 0, 0))
