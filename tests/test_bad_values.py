"""Bad values of every feature type, through both layouts, into both stores.

A first run stores known values for every entity; a second date holds values drawn at
random (seeded, so every run sees the same ones) from pools of good and bad values. The
second run must complete; every entity with a bad value is quarantined with reasons
naming its features and counted, and keeps, byte for byte, what the first run stored in
Redis and in SQL; the good entities hold their new values. Expectations are derived here
from the values themselves, by the rules feature_defs/README.md states, never from the job's code.

Wide sources hold columns of the right Spark types, so their bad values are the ones a
type cannot rule out (a double beyond float32 range, an embedding of the wrong dimension,
null list elements, ...); long sources carry every value in one string or double column,
so their scalars can be anything.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from decimal import Decimal

import numpy as np
import yaml
from pyspark.sql import functions as F

from feature_defs import FeatureDef
from jobs.pipeline.run import run_source
from jobs.transforms import REASONS, long_features
from serializers import encode, field_id

from .support.bad_values import as_of, f32, same_json, written
from .support.samples import SAMPLE_DATES, tiny_consumer_source, tiny_long_consumer_source

DAY1, DAY2 = SAMPLE_DATES
FLT_MAX = float(np.finfo(np.float32).max)
FLT_EDGE = FLT_MAX + 2.0**103  # FLT_MAX plus half its ulp: rounds (to even) to inf in float32
BELOW_EDGE = float(np.nextafter(FLT_EDGE, 0.0))  # rounds down to FLT_MAX: a good value


def bad_run_conf(sql_conf, tmp_path):
    """Both stores, and a quality gate that lets a snapshot of mostly bad rows through."""
    quality = sql_conf.quality.model_copy(update={"max_bad_fraction": 1.0})
    return sql_conf.model_copy(update={"data_root": str(tmp_path), "sinks": ["redis", "sql"], "quality": quality})


def stored_state(redis_db, pg_db, source_name: str) -> tuple[dict, dict]:
    """Raw: Redis hash per consumer id, and the SQL row (features text, as_of) per entity key."""
    hashes = {int(key.split(b":")[1]): redis_db.hgetall(key) for key in redis_db.scan_iter(match=b"c:*")}
    rows = pg_db.execute("SELECT entity_key, features::text, as_of FROM consumer_features WHERE source = %s", (source_name,)).fetchall()
    return hashes, {int(key): (text, stamp) for key, text, stamp in rows}


def check_stores(spark, summary, source, day, values: dict, reasons: dict, before: tuple[dict, dict], redis_db, pg_db) -> None:
    """``values``: the new good values per consumer; ``reasons``: the bad consumers' reasons.
    Consumers in neither (bad ones, and ones absent from the date) must hold ``before``."""
    hashes, rows = stored_state(redis_db, pg_db, source.name)
    ts_field = field_id(f"_ts:{source.name}")
    for cid, row in values.items():
        want = {field_id(f.name): encode(f.type, row.get(f.name), **f.options) for f in source.features if written(f, row.get(f.name))}
        assert hashes[cid] == {**want, ts_field: str(int(as_of(day).timestamp())).encode()}, cid
        text, stamp = rows[cid]
        stored = json.loads(text)
        assert stamp == as_of(day)
        assert set(stored) == {f.name for f in source.features if written(f, row.get(f.name))}, cid
        assert all(same_json(source.feature(name), stored[name], row[name]) for name in stored), (cid, stored, row)
    kept = set(before[0]) - set(values)
    assert kept >= set(reasons)
    assert {cid: hashes[cid] for cid in kept} == {cid: before[0][cid] for cid in kept}
    assert {cid: rows[cid] for cid in kept} == {cid: before[1][cid] for cid in kept}

    assert summary.status == "succeeded"
    assert summary.bad_rows == len(reasons)
    assert summary.bad_reasons == Counter(r for rs in reasons.values() for r in rs)
    assert summary.entities == len(values)
    non_finite = sum(
        1
        for row in values.values()
        for f in source.features
        if f.type == "float" and row.get(f.name) is not None and not math.isfinite(row[f.name])
    )
    set_values = sum(1 for row in values.values() for f in source.features if written(f, row.get(f.name)))
    assert summary.sinks["redis"]["non_finite"] == summary.sinks["sql"]["non_finite"] == non_finite
    assert summary.sinks["redis"]["values_set"] == set_values
    assert summary.sinks["sql"]["rows_upserted"] == len(values)
    quarantined = spark.read.format("delta").load(summary.quarantine_table).where(f"ds = '{day}'").collect()
    assert {r["stage"] for r in quarantined} <= {"value"}
    assert {json.loads(r["row"])["consumer_id"]: sorted(r["reasons"]) for r in quarantined} == {
        cid: sorted(rs) for cid, rs in reasons.items()
    }


def first_date(spark, sql_conf, tmp_path, defs, name: str, day1: dict, redis_db, pg_db):
    """Run DAY1 of source ``name`` (all good values) and check it: (source, conf, what the stores hold)."""
    source = defs.sources[name]
    conf = bad_run_conf(sql_conf, tmp_path)
    first = run_source(spark, conf, defs, name, DAY1)
    check_stores(spark, first, source, DAY1, day1, {}, ({}, {}), redis_db, pg_db)
    return source, conf, stored_state(redis_db, pg_db, name)


# --- wide layout ---------------------------------------------------------------------

WIDE_FEATURES = """\
    - {name: score, type: float}
    - {name: score32, type: float, precision: float32}
    - {name: count, type: int}
    - {name: flag, type: bool}
    - {name: label, type: string, max_length: 8}
    - {name: vec, type: embedding, dimension: 3}
    - {name: ids, type: int_list}
    - {name: tags, type: string_list}
"""
WIDE_SCHEMA = (
    "consumer_id long, score double, score32 double, count long, flag boolean, label string, "
    "vec array<double>, ids array<long>, tags array<string>, ds date"
)
WIDE_NAMES = ["score", "score32", "count", "flag", "label", "vec", "ids", "tags"]
WIDE_GOOD = {
    "score": [0.5, -2.25, 1e300, 5e-324, 0.0, -0.0, 1e22, None, math.nan, math.inf, -math.inf],
    "score32": [0.1, FLT_MAX, -FLT_MAX, BELOW_EDGE, 1e-45, 1e-50, -0.0, None, math.nan, math.inf, -math.inf],
    "count": [0, -1, 2**63 - 1, -(2**63), 2**53 + 1, None],
    "flag": [True, False, None],
    "label": ["", "abc", "ünïcödé", "12345678", None],
    "vec": [[0.1, 0.2, 0.3], [FLT_MAX, 0.0, -1.0], [1e-50, 5e-324, -0.0], None],
    "ids": [[], [1, 2, 3], [2**63 - 1, -(2**63)], None],
    "tags": [[], ["a", "ü"], None],
}
WIDE_BAD = {  # float64, int and bool columns hold nothing their feature cannot take
    "score32": [1e40, -1e39, 3.5e38, 1e300, FLT_EDGE, -FLT_EDGE],
    "label": ["123456789", "x" * 40, "a\x00b"],
    "vec": [
        [1.0, 2.0],
        [1.0, 2.0, 3.0, 4.0],
        [],
        [math.nan, 0.0, 0.0],
        [0.0, math.inf, 0.0],
        [1e40, 0.0, 0.0],
        [None, 0.0, 0.0],
        [math.nan, 1.0],
    ],
    "ids": [[1, None], [None]],
    "tags": [["a", None], ["x\x00"], [None, "y\x00"]],
}
NUL = "NUL character (not storable in JSONB)"


def wide_reasons(name: str, v) -> list[str]:
    if v is None:
        return []
    out = []
    if name == "score32" and math.isfinite(v) and np.isinf(f32(v)):
        out.append("score32: beyond float32 range")
    if name == "label":
        out += ["label: longer than 8 characters"] * (len(v) > 8) + [f"label: {NUL}"] * ("\x00" in v)
    if name == "vec":
        out += ["vec: embedding dimension is not 3"] * (len(v) != 3)
        out += ["vec: embedding element is null or not finite"] * any(x is None or not np.isfinite(f32(x)) for x in v)
    if name in ("ids", "tags") and any(x is None for x in v):
        out.append(f"{name}: null list element")
    if name == "tags" and any(x is not None and "\x00" in x for x in v):
        out.append(f"tags: {NUL}")
    return out


def test_bad_values_of_a_wide_source_are_quarantined_and_stored_values_kept(spark, sql_conf, redis_db, pg_db, tmp_path):
    rng = random.Random(20261120)
    entities = range(1, 201)
    day1 = {cid: {"score": cid / 8, "score32": cid / 16, "count": cid, "flag": cid % 2 == 0, "label": f"c{cid}",
                  "vec": [float(cid), -float(cid), 0.5], "ids": [cid, cid + 1], "tags": [f"t{cid}"]} for cid in entities}  # fmt: skip
    day2 = {
        cid: {n: rng.choice(WIDE_BAD[n]) if n in WIDE_BAD and rng.random() < 0.1 else rng.choice(WIDE_GOOD[n]) for n in WIDE_NAMES}
        for cid in entities
    }
    rows = [(cid, *(v[n] for n in WIDE_NAMES), day) for day, values in ((DAY1, day1), (DAY2, day2)) for cid, v in values.items()]
    defs = tiny_consumer_source(spark, tmp_path, WIDE_FEATURES, WIDE_SCHEMA, rows)
    source, conf, before = first_date(spark, sql_conf, tmp_path, defs, "tiny", day1, redis_db, pg_db)

    reasons = {cid: rs for cid, v in day2.items() if (rs := [r for n in WIDE_NAMES for r in wide_reasons(n, v[n])])}
    assert 30 < len(reasons) < 150  # the draw holds both kinds, and every kind of bad value
    assert {r.split(":")[0] for rs in reasons.values() for r in rs} == set(WIDE_BAD)
    summary = run_source(spark, conf, defs, "tiny", DAY2)
    check_stores(spark, summary, source, DAY2, {cid: v for cid, v in day2.items() if cid not in reasons}, reasons, before, redis_db, pg_db)


# --- long layout -----------------------------------------------------------------------

LONG_FEATURES = """\
    - {name: score, type: float}
    - {name: score32, type: float, precision: float32}
    - {name: count, type: int}
    - {name: flag, type: bool}
"""
LABEL = "    - {name: label, type: string, max_length: 8}\n"

NUMBER_TEXT = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?")
SPELLED = {"nan": math.nan, "+nan": math.nan, "-nan": math.nan, "inf": math.inf, "+inf": math.inf,
           "infinity": math.inf, "+infinity": math.inf, "-inf": -math.inf, "-infinity": -math.inf}  # fmt: skip
BOOL_TEXT = {"true": True, "1": True, "1.0": True, "false": False, "0": False, "0.0": False}


def from_text(feature, text: str | None) -> tuple[object, list[str]]:
    """(value, reasons) of a text in a long source's string value column, by feature_defs/README.md's rules."""
    name = feature.name
    if text is None:
        return None, []
    if feature.type == "string":
        return text, [f"{name}: longer than 8 characters"] * (len(text) > 8) + [f"{name}: {NUL}"] * ("\x00" in text)
    t = text.strip(" ")
    if feature.type == "bool":
        return (BOOL_TEXT[t.lower()], []) if t.lower() in BOOL_TEXT else (None, [f"{name}: not a bool (true/false, 1/0)"])
    number = NUMBER_TEXT.fullmatch(t)
    if feature.type == "int":
        d = Decimal(t) if number else None
        if d is not None and d == d.to_integral_value() and -(2**63) <= d < 2**63:
            return int(d), []
        return None, [f"{name}: not an integer within int64"]
    if not number:
        return (SPELLED[t.lower()], []) if t.lower() in SPELLED else (None, [f"{name}: not a number"])
    v = float(t)
    precision = feature.precision or "float64"
    if math.isinf(v) or (precision == "float32" and np.isinf(f32(v))):
        return None, [f"{name}: beyond {precision} range"]
    return v, []


def from_double(feature, v: float | None) -> tuple[object, list[str]]:
    """(value, reasons) of a value in a long source's double value column, by feature_defs/README.md's rules."""
    name = feature.name
    if v is None:
        return None, []
    if feature.type == "bool":
        return (v == 1, []) if v in (0.0, 1.0) else (None, [f"{name}: not a bool (true/false, 1/0)"])
    if feature.type == "int":
        if math.isfinite(v) and v.is_integer() and -(2**63) <= v < 2**63:
            return int(v), []
        return None, [f"{name}: not an integer within int64"]
    if feature.precision == "float32" and math.isfinite(v) and np.isinf(f32(v)):
        return None, [f"{name}: beyond float32 range"]
    return v, []


TEXT_VALUES = [
    "abc", "", " ", "1", "-7", "+5", " 42 ", "\t1", "1.5", "1.0", "1.00", "1.", ".5", "-0", "0.5e1", "1.0E7", "100e-2", "150e-2",
    "1e-400", "1e40", "-1e39", "3.4028235e38", "3.5e38", "1e400", "-1e400", "1e19", "1e99999999999", "1e2147483647", "NaN", "nan", "-nan",
    "inf", "-Infinity", "INF", "+inf", "9223372036854775807", "9223372036854775808", "-9223372036854775808",
    "-9223372036854775809", "9007199254740993", "9007199254740993.0", "0x10", "1d", "1_000", "٣", "1e", "e5", "1 2",
    "true", "True", "FALSE", "yes", "t", "0", "0.0", "12345678", "123456789", "ünïcödé!", "a\x00b",
]  # fmt: skip
DOUBLE_VALUES = [
    1.0, 1.5, -0.0, 0.0, 2.0, -3.0, 7.0, math.nan, math.inf, -math.inf, 1e40, -3.5e38, FLT_MAX, FLT_EDGE, BELOW_EDGE,
    2.0**63, -(2.0**63), 2.0**63 - 1024, 2.0**53 + 2, 9.3e18, 1e-300, 1e300, None,
]  # fmt: skip


def good_text(rng: random.Random, feature) -> str:
    return {
        "float": lambda: repr(rng.uniform(-1e6, 1e6)),
        "int": lambda: str(rng.randint(-(2**63), 2**63 - 1)),
        "bool": lambda: rng.choice(["true", "false", "1", "0"]),
        "string": lambda: rng.choice(["", "pizza", "日本料理"]),
    }[feature.type]()


def long_features_of(features_yaml: str) -> list[FeatureDef]:
    return [FeatureDef(**f) for f in yaml.safe_load("features:\n" + features_yaml)["features"]]


def long_draw(rng: random.Random, features: list[FeatureDef], good, junk, parse, day1_value) -> tuple[list, dict, dict, dict, int]:
    """Rows of both dates, the expected day-1 and day-2 values, the day-2 reasons, ignored rows."""
    rows, day1, day2, reasons = [], {}, {}, {}
    for cid in range(1, 161):
        day1[cid] = {}
        for f in features:
            rows.append((cid, f.name, day1_value(f, cid), DAY1))
            day1[cid][f.name] = parse(f, day1_value(f, cid))[0]
        values, bad, present = {}, [], False
        for f in features:
            if rng.random() < 0.08:
                continue  # no row: the feature is null in this snapshot
            raw = rng.choice(junk) if rng.random() < 0.25 else good(rng, f)
            rows.append((cid, f.name, raw, DAY2))
            values[f.name], why = parse(f, raw)
            bad, present = bad + why, True
        if bad:
            reasons[cid] = bad
        elif present:
            day2[cid] = values
    ignored = [(cid, "not_defined", junk[cid % len(junk)], DAY2) for cid in range(1, 161, 16)]
    return rows + ignored, day1, day2, reasons, len(ignored)


def run_long(spark, sql_conf, redis_db, pg_db, tmp_path, features_yaml, value_type, good, junk, parse, day1_value, seed) -> dict:
    rows, day1, day2, reasons, ignored = long_draw(random.Random(seed), long_features_of(features_yaml), good, junk, parse, day1_value)
    defs = tiny_long_consumer_source(spark, tmp_path, features_yaml, value_type, rows)
    source, conf, before = first_date(spark, sql_conf, tmp_path, defs, "tiny_long", day1, redis_db, pg_db)

    assert 30 < len(reasons) < 130
    summary = run_source(spark, conf, defs, "tiny_long", DAY2)
    check_stores(spark, summary, source, DAY2, day2, reasons, before, redis_db, pg_db)
    assert summary.rows_read == sum(1 for r in rows if r[3] == DAY2)
    assert (summary.ignored_rows, summary.superseded_rows) == (ignored, 0)
    return reasons


def test_bad_text_values_of_a_long_source_are_quarantined_and_stored_values_kept(spark, sql_conf, redis_db, pg_db, tmp_path):
    def day1_text(f, cid):
        return {
            "score": f"{cid / 8}",
            "score32": f"{cid / 16}",
            "count": str(cid),
            "flag": "true" if cid % 2 else "false",
            "label": f"c{cid}",
        }[f.name]

    reasons = run_long(
        spark, sql_conf, redis_db, pg_db, tmp_path, LONG_FEATURES + LABEL, "string", good_text, TEXT_VALUES, from_text, day1_text, 20261121
    )
    seen = {r for rs in reasons.values() for r in rs}
    assert {
        "score: not a number",
        "score: beyond float64 range",
        "score32: beyond float32 range",
        "count: not an integer within int64",
        "flag: not a bool (true/false, 1/0)",
        "label: longer than 8 characters",
    } <= seen  # fmt: skip (NUL: the wide test)


def test_bad_double_values_of_a_long_source_are_quarantined_and_stored_values_kept(spark, sql_conf, redis_db, pg_db, tmp_path):
    def good_double(rng, f):
        return {"float": rng.uniform(-1e6, 1e6), "int": float(rng.randint(-(2**53), 2**53)), "bool": float(rng.random() < 0.5)}[f.type]

    def day1_double(f, cid):
        return {"score": cid / 8, "score32": cid / 16, "count": float(cid), "flag": float(cid % 2)}[f.name]

    reasons = run_long(
        spark, sql_conf, redis_db, pg_db, tmp_path, LONG_FEATURES, "double", good_double, DOUBLE_VALUES, from_double, day1_double, 20261122
    )
    seen = {r for rs in reasons.values() for r in rs}
    assert {"score32: beyond float32 range", "count: not an integer within int64", "flag: not a bool (true/false, 1/0)"} <= seen


# --- the long layout's parsing rules, one value at a time ------------------------------

PARSED = [  # text, then (value or reason) as int, bool, float, float32
    ("1", 1, True, 1.0, 1.0),
    ("1.0", 1, True, 1.0, 1.0),
    (" 0.0 ", 0, False, 0.0, 0.0),
    ("1.0E7", 10_000_000, "bool", 1e7, 1e7),
    ("100e-2", 1, "bool", 1.0, 1.0),
    ("9007199254740993", 9007199254740993, "bool", 9007199254740992.0, 9007199254740992.0),
    ("-9223372036854775808", -(2**63), "bool", -(2.0**63), -(2.0**63)),
    ("9223372036854775808", "int", "bool", 2.0**63, 2.0**63),
    ("1.5", "int", "bool", 1.5, 1.5),
    ("True", "int", True, "number", "number"),
    ("abc", "int", "bool", "number", "number"),
    ("", "int", "bool", "number", "number"),
    ("0x10", "int", "bool", "number", "number"),
    ("NaN", "int", "bool", math.nan, math.nan),
    ("-inf", "int", "bool", -math.inf, -math.inf),
    ("1e40", "int", "bool", 1e40, "float32"),
    ("1e400", "int", "bool", "float64", "float32"),
    ("1e-400", "int", "bool", 0.0, 0.0),
]
PARSE_REASONS = {"int": "n: not an integer within int64", "bool": "b: not a bool (true/false, 1/0)", "number": "{}: not a number",
                 "float64": "{}: beyond float64 range", "float32": "{}: beyond float32 range"}  # fmt: skip


def test_long_layout_reads_text_values_by_the_documented_rules(spark, tmp_path):
    features = (
        "    - {name: n, type: int}\n    - {name: b, type: bool}\n    - {name: d, type: float}\n"
        "    - {name: s, type: float, precision: float32}\n"
    )
    rows = [(i, name, text, DAY2) for i, (text, *_) in enumerate(PARSED) for name in ("n", "b", "d", "s")]
    defs = tiny_long_consumer_source(spark, tmp_path, features, "string", rows)
    source = defs.sources["tiny_long"]
    df = spark.read.format("delta").load(str(tmp_path / "tiny_long")).withColumn(REASONS, F.array().cast("array<string>"))
    got = {r["consumer_id"]: r for r in long_features(df, source, defs.entity_of(source)).collect()}
    for i, (text, *expected) in enumerate(PARSED):
        row, reasons = got[i], []
        for name, want in zip(("n", "b", "d", "s"), expected):
            if isinstance(want, str):
                reasons.append(PARSE_REASONS[want].format(name))  # the row is not written, whatever its value
            elif isinstance(want, float) and math.isnan(want):
                assert math.isnan(row[name]), (text, name)
            else:
                assert row[name] == want and type(row[name]) is type(want), (text, name, row[name])
        assert sorted(row[REASONS]) == sorted(reasons), text
