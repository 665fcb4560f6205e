"""The transforms as DataFrame in, DataFrame out: small frames built here, expected rows
written down by hand (no stores, no files)."""

from __future__ import annotations

import datetime as dt
import json
import struct

import pytest

from feature_defs.models import EntityDef, SourceDef
from jobs import transforms as tf

STORE = EntityDef(
    name="store", prefix="s", keys=[{"name": "region", "type": "string"}, {"name": "store_id", "type": "int"}], sql_table="store_features"
)
WIDE = SourceDef(
    name="tiny", entity="store", location="tiny", layout="wide", date_column="ds", timestamp_column="ts",
    features=[{"name": "score", "type": "float", "precision": "float32"}, {"name": "n", "type": "int"}],
)  # fmt: skip
SCHEMA = "region string, store_id long, score double, n long, ts timestamp, ds date"
D1, D2 = dt.date(2026, 11, 19), dt.date(2026, 11, 20)
ONE_AS_BITS = struct.unpack("<q", struct.pack("<d", 1.0))[0]  # the long with the bits of the double 1.0


def at(hour: int) -> dt.datetime:
    return dt.datetime(2026, 11, 20, hour)


def rows_by_key(df, *columns: str) -> dict:
    return {tuple(r[c] for c in ("region", "store_id")): tuple(r[c] for c in columns) for r in df.collect()}


def test_unusable_keys_are_tagged_with_their_reasons(spark):
    df = spark.createDataFrame(
        [("nyc", 1, 1.0, 1, at(1), D2), (None, 2, 1.0, 1, at(1), D2), ("", 3, 1.0, 1, at(1), D2), ("a:b", 4, 1.0, 1, at(1), D2),
         ("tab\there", 5, 1.0, 1, at(1), D2), ("nyc", None, 1.0, 1, at(1), D2)],
        SCHEMA,
    ).withColumn(tf.REASONS, tf.F.array().cast("array<string>"))  # fmt: skip
    got = {(r["region"], r["store_id"]): r[tf.REASONS] for r in tf.tag_key_problems(df, WIDE, STORE).collect()}
    assert got == {
        ("nyc", 1): [], (None, 2): ["null key region"], ("", 3): ["empty key region"], ("a:b", 4): ["key region contains ':'"],
        ("tab\there", 5): ["key region contains a control character"], ("nyc", None): ["null key store_id"],
    }  # fmt: skip


def test_the_latest_row_per_key_wins_and_ties_are_counted_as_conflicts(spark):
    rows = [
        ("nyc", 1, 1.0, 10, at(1), D2), ("nyc", 1, 2.0, 20, at(3), D2), ("nyc", 1, 3.0, 30, at(2), D2),  # latest: at(3)
        ("sf", 2, 1.0, 1, at(5), D2), ("sf", 2, 9.0, 9, at(5), D2),  # a tie with other values: a conflict
        ("la", 3, 4.0, 4, at(5), D2), ("la", 3, 4.0, 4, at(5), D2),  # a copy: no conflict
        # a tie whose non-null values have the same bits in other columns (Spark's hashes skip nulls)
        ("ny", 4, 1.0, None, at(5), D2), ("ny", 4, None, ONE_AS_BITS, at(5), D2),
        # 0.0 and -0.0 are written apart (Spark's hashes take them for one): a conflict
        ("zz", 5, 0.0, 1, at(5), D2), ("zz", 5, -0.0, 1, at(5), D2),
    ]  # fmt: skip
    for ordered in (rows, rows[::-1]):  # the input order changes nothing
        df = spark.createDataFrame(ordered, SCHEMA).withColumn(tf.REASONS, tf.F.array().cast("array<string>"))
        got = rows_by_key(tf.latest_per_key(df, WIDE, ["region", "store_id"]), "score", "n", tf.CONFLICTS)
        assert got[("nyc", 1)] == (2.0, 20, 0) and got[("la", 3)] == (4.0, 4, 0)
        assert got[("sf", 2)][2] == 1 and got[("sf", 2)][:2] in ((1.0, 1), (9.0, 9))
        assert got[("ny", 4)][2] == 1 and got[("zz", 5)][2] == 1
    first = rows_by_key(tf.latest_per_key(spark.createDataFrame(rows, SCHEMA), WIDE, ["region", "store_id"]), "n")
    again = rows_by_key(tf.latest_per_key(spark.createDataFrame(rows[::-1], SCHEMA), WIDE, ["region", "store_id"]), "n")
    assert first == again  # the tie is broken the same way whatever the order


def test_the_latest_row_per_key_costs_one_sort(spark):
    """The order's hashes were expressions, computed again for each window over them: Spark
    sorted every row four times (2.6-2.9 s against 4.4-5.7 s for 1,000,000 keys x 3 rows)."""
    import re

    df = spark.createDataFrame([("nyc", 1, 1.0, 10, at(1), D2)], SCHEMA).withColumn(tf.REASONS, tf.F.array().cast("array<string>"))
    plan = tf.latest_per_key(df, WIDE, ["region", "store_id"])._jdf.queryExecution().executedPlan().toString()
    assert len(re.findall(r"\bSort \[", plan)) == 1, plan


def test_one_row_per_key_skips_the_de_duplication_and_gives_the_same_rows(spark):
    rows = [("nyc", 1, 1.5, 10, at(1), D2), ("sf", 2, None, 20, at(3), D2), ("la", 3, 1e39, 30, None, D2)]
    df = spark.createDataFrame(rows, SCHEMA).withColumn(tf.REASONS, tf.F.array().cast("array<string>"))
    columns = ("score", "n", tf.REASONS, tf.CONFLICTS)
    sorted_ = rows_by_key(tf.wide_features(df, WIDE, STORE), *columns)
    skipped = rows_by_key(tf.wide_features(df, WIDE, STORE, unique=True), *columns)
    assert skipped == sorted_ and len(skipped) == 3
    assert skipped[("la", 3)][2] == ["score: beyond float32 range"] and skipped[("sf", 2)][:2] == (None, 20)


@pytest.mark.parametrize(("score", "typed", "reasons"), [
    (1.5, 1.5, []),
    (3.4028234663852886e38, 3.4028234663852886e38, []),
    (1e40, None, ["score: beyond float32 range"]),  # finite, but inf as float32: bad input, not a delete
    (float("nan"), None, []),  # NaN is a good value that is not written
])  # fmt: skip
def test_wide_features_are_typed_and_values_beyond_range_are_bad_input(spark, score, typed, reasons):
    df = spark.createDataFrame([("nyc", 1, score, 7, at(1), D2)], SCHEMA).withColumn(tf.REASONS, tf.F.array().cast("array<string>"))
    row = tf.wide_features(df, WIDE, STORE).collect()[0]
    assert row[tf.REASONS] == reasons and row["n"] == 7
    if typed is not None:
        assert row["score"] == pytest.approx(typed, rel=1e-7)
    assert (
        df.schema["score"].dataType.simpleString() == "double"
        and tf.wide_features(df, WIDE, STORE).schema["score"].dataType.simpleString() == "float"
    )


def test_the_entity_id_joins_the_key_parts(spark):
    df = spark.createDataFrame([("nyc", 1, 1.0, 1, at(1), D2), ("ünï", -20, 1.0, 1, at(1), D2)], SCHEMA)
    assert sorted(r[tf.ENTITY_ID] for r in tf.with_entity_id(df, WIDE, STORE).collect()) == ["nyc:1", "ünï:-20"]


def test_a_range_keeps_each_entitys_good_row_of_its_latest_date_with_its_as_of(spark):
    rows = [("nyc", 1, 1.0, 1, at(1), D1), ("nyc", 1, 2.0, 2, at(1), D2), ("sf", 2, 3.0, 3, at(1), D1), ("sf", 2, 4.0, 4, at(1), D2)]
    df = spark.createDataFrame(rows, SCHEMA).withColumn(
        tf.REASONS, tf.F.when(tf.F.col("n") == 4, tf.F.array(tf.F.lit("bad"))).otherwise(tf.F.array().cast("array<string>"))
    )
    got = rows_by_key(tf.latest_good_date(df, WIDE, STORE), "n", "ds", tf.AS_OF)
    # sf's D2 row is bad input: sf keeps D1, as applying the dates in order would leave it
    assert got == {("nyc", 1): (2, D2, 1795219200), ("sf", 2): (3, D1, 1795132800)}


LISTS = SourceDef(
    name="lists", entity="store", location="lists", layout="wide",
    features=[{"name": "emb", "type": "embedding", "dimension": 2}, {"name": "ids", "type": "int_list"},
              {"name": "tags", "type": "string_list"}],
)  # fmt: skip
NAN, INF = float("nan"), float("inf")
EMBEDDINGS = [
    None,
    [],
    [1.0, 2.0],
    [1.0, None],
    [None, None],
    [NAN, 1.0],
    [1.0, INF],
    [-INF, 1.0],
    [NAN, None],
    [3.0e38, -3.0e38],
    [1.0, 2.0, NAN],
]
ID_LISTS = [None, [], [3, 1], [None], [3, None, 1], [None, None], [2**62, -(2**62)]]
TAG_LISTS = [None, [], ["b", "a"], ["a", None], [None]]


def expected_reasons(emb, ids, tags) -> list[str]:
    """The documented rules, from the values themselves."""
    out = []
    if emb is not None and len(emb) != 2:
        out.append("emb: embedding dimension is not 2")
    if emb is not None and any(x is None or x != x or abs(x) == INF for x in emb):
        out.append("emb: embedding element is null or not finite")
    out += [f"{name}: null list element" for name, v in (("ids", ids), ("tags", tags)) if v is not None and None in v]
    return out


def test_list_and_embedding_problems_are_tagged_by_the_documented_rules(spark):
    rows = [(e, i, t) for e in EMBEDDINGS for i in ID_LISTS for t in TAG_LISTS]
    df = spark.createDataFrame([(n, *r) for n, r in enumerate(rows)], "n long, emb array<float>, ids array<bigint>, tags array<string>")
    tagged = {r["n"]: r[tf.REASONS] for r in tf.tag_value_problems(df, LISTS).collect()}
    assert len(tagged) == len(rows) == 385
    assert {n: expected_reasons(*rows[n]) for n in tagged} == tagged


ODD_COLUMNS = "`a.b` long, `x y` string, `un``read` double, `größe` string"  # columns no feature reads


def test_columns_no_feature_reads_may_have_any_name(spark):
    """A dot, a space, a backtick, letters beyond ASCII: the de-duplication hashes such columns
    and the quarantine keeps them, under their names, like any other."""
    rows = [
        ("nyc", 1, 1.0, 10, at(1), D2, 1, "a", 0.5, "ß"), ("nyc", 1, 2.0, 20, at(3), D2, 2, "b", 1.5, "é"),  # latest: at(3)
        ("sf", 2, 3.0, 30, at(5), D2, 3, "c", 2.5, "ü"), ("sf", 2, 3.0, 30, at(5), D2, 4, "d", 3.5, "ñ"),  # a tie, same features
        (None, 3, 4.0, 40, at(1), D2, 5, "e", 4.5, "ø"),  # a null key: quarantined whole
    ]  # fmt: skip
    df = spark.createDataFrame(rows, f"{SCHEMA}, {ODD_COLUMNS}")
    tagged = tf.tag_key_problems(df, WIDE, STORE)
    latest = tf.wide_features(tagged.where(~tf.is_bad(tagged)), WIDE, STORE)
    assert rows_by_key(latest, "n", tf.CONFLICTS) == {("nyc", 1): (20, 0), ("sf", 2): (30, 0)}  # other columns: no conflict
    kept = [(r["reasons"], json.loads(r["row"])) for r in tf.quarantine_rows(tagged, WIDE, str(D2), "key").collect()]
    assert kept == [
        (["null key region"], {"store_id": 3, "score": 4.0, "n": 40, "ts": "2026-11-20T01:00:00.000Z", "ds": "2026-11-20", "a.b": 5,
                               "x y": "e", "un`read": 4.5, "größe": "ø"})
    ]  # fmt: skip


ODD_LONG = SourceDef(
    name="odd", entity="store", location="odd", layout="long", key_columns=["region.name", "store `id`"], date_column="jour ds",
    timestamp_column="mis à jour", name_column="feature.name", value_column="the value",
    features=[{"name": "score", "type": "float"}, {"name": "n", "type": "int", "column": "n.count"}],
)  # fmt: skip


def test_a_long_layouts_key_time_name_and_value_columns_may_have_any_name(spark):
    schema = "`region.name` string, `store ``id``` long, `feature.name` string, `the value` string, `mis à jour` timestamp, `jour ds` date"
    rows = [
        ("nyc", 1, "score", "1.5", at(1), D1), ("nyc", 1, "score", "2.5", at(2), D1), ("nyc", 1, "n.count", "7", at(1), D1),
        ("nyc", 1, "score", "3.5", at(1), D2), ("sf", 2, "n.count", "x", at(1), D2),
    ]  # fmt: skip
    df = spark.createDataFrame(rows, schema).withColumn(tf.REASONS, tf.F.array().cast("array<string>"))
    per_date = tf.long_features(df, ODD_LONG, STORE, per_date=True)
    got = {(r["region.name"], r["store `id`"], r["jour ds"]): (r["score"], r["n"], r[tf.REASONS]) for r in per_date.collect()}
    assert got == {
        ("nyc", 1, D1): (2.5, 7, []),
        ("nyc", 1, D2): (3.5, None, []),
        ("sf", 2, D2): (None, None, ["n: not an integer within int64"]),
    }
    latest = tf.latest_good_date(tf.with_entity_id(per_date, ODD_LONG, STORE), ODD_LONG, STORE)
    assert {r[tf.ENTITY_ID]: (r["score"], r["jour ds"], r[tf.AS_OF]) for r in latest.collect()} == {"nyc:1": (3.5, D2, 1795219200)}


def test_a_string_over_a_decimal_column_is_the_decimals_exact_text_as_python_writes_it(spark):
    from decimal import Decimal

    from pyspark.sql import types as T

    # Python's str(Decimal) (what Feast stores for a Decimal feature): plain down to 1E-6, below
    # that scientific, every digit of the scale kept; Spark's own cast writes them all plain
    scales = {0: ["0", "-12", "99999999999999999999"], 3: ["12.500", "-0.001", "0.000", "1000000.000"],
              10: ["0.0000010000", "0.0000001000", "-0.0000000001", "0E-10", "123.4560000000", "-9.9999999999"]}  # fmt: skip
    source = SourceDef(
        name="tiny", entity="store", location="tiny", layout="wide", date_column="ds",
        features=[{"name": f"d{s}", "type": "string"} for s in scales],
    )  # fmt: skip
    width = max(map(len, scales.values()))
    rows = [("nyc", i, *(Decimal(v[i]) if i < len(v) else None for v in scales.values()), D2) for i in range(width)]
    schema = T.StructType(
        [T.StructField("region", T.StringType()), T.StructField("store_id", T.LongType())]
        + [T.StructField(f"d{s}", T.DecimalType(20, s)) for s in scales]
        + [T.StructField("ds", T.DateType())]
    )
    df = spark.createDataFrame(rows, schema).withColumn(tf.REASONS, tf.F.array().cast("array<string>"))
    assert tf.schema_problems(df.schema, source, STORE) == []
    got = {r["store_id"]: r for r in tf.wide_features(df, source, STORE).collect()}
    for s, values in scales.items():
        assert [got[i][f"d{s}"] for i in range(width)] == [str(Decimal(v)) for v in values] + [None] * (width - len(values)), s
    assert [got[i]["d10"] for i in range(3)] == ["0.0000010000", "1.000E-7", "-1E-10"]  # the rule's edge, written out
    assert all(r[tf.REASONS] == [] for r in got.values())

    # an array of decimals under a string_list: each element so
    lists = SourceDef(
        name="tiny", entity="store", location="tiny", layout="wide", date_column="ds", features=[{"name": "ds10", "type": "string_list"}]
    )
    element = T.DecimalType(20, 10)
    arrays = spark.createDataFrame(
        [("nyc", 1, [Decimal(v) for v in scales[10]] + [None], D2), ("nyc", 2, None, D2)],
        T.StructType([*schema.fields[:2], T.StructField("ds10", T.ArrayType(element)), T.StructField("ds", T.DateType())]),
    ).withColumn(tf.REASONS, tf.F.array().cast("array<string>"))
    assert tf.schema_problems(arrays.schema, lists, STORE) == []
    got = {r["store_id"]: r["ds10"] for r in tf.wide_features(arrays, lists, STORE).collect()}
    assert got == {1: [str(Decimal(v)) for v in scales[10]] + [None], 2: None}


def test_rows_holding_nested_maps_are_de_duplicated(spark):
    """Spark hashes no map, even one inside an array (a json feature's column may hold one): such
    a column is hashed as its JSON text, both to order a key's rows and to find conflicts."""
    rows = [
        ("nyc", 1, 1.0, 10, at(5), D2, [{"a": "1"}]), ("nyc", 1, 1.0, 10, at(5), D2, [{"a": "2"}]),  # a tie, same features
        ("sf", 2, 1.0, 10, at(5), D2, [{"a": "1"}]), ("sf", 2, 2.0, 10, at(5), D2, [{"a": "1"}]),  # a tie, other features
    ]  # fmt: skip
    df = spark.createDataFrame(rows, f"{SCHEMA}, meta array<map<string,string>>").withColumn(tf.REASONS, tf.F.array().cast("array<string>"))
    got = rows_by_key(tf.latest_per_key(df, WIDE, ["region", "store_id"]), tf.CONFLICTS)
    assert got == {("nyc", 1): (0,), ("sf", 2): (1,)}
