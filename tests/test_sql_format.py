"""The SQL store's bytes and statements, pinned as fixed text (no server needed)."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

from serializers.batch import FeatureSpec
from serializers.json_map import encode_json_maps
from sinks.sql.statements import create_table, dialect_from_version, quantile_keys, split_at, table_identifier, upsert
from stores.sql import is_transient

SPECS = [
    FeatureSpec("f", "float"),
    FeatureSpec("f32", "float", {"precision": "float32"}),
    FeatureSpec("n", "int"),
    FeatureSpec("b", "bool"),
    FeatureSpec("s", "string"),
    FeatureSpec("e", "embedding", {"dimension": 2}),
    FeatureSpec("il", "int_list"),
    FeatureSpec("sl", "string_list"),
]


def batch() -> pa.Table:
    return pa.table(
        {
            "f": pa.array([0.1, -0.0, 1e22, float("nan"), None, 3.0, 1e-7, float("-inf")]),
            "f32": pa.array([0.1, 1e-7, None, 16777217.0, None, None, 2.5, None]),
            "n": pa.array([-(2**63), 2**63 - 1, 0, None, None, None, 7, None], pa.int64()),
            "b": pa.array([True, False, None, None, None, None, True, None]),
            "s": pa.array(['a"b\\c', "tab\there", "日本\u2028", None, None, "\x01", "", None]),
            "e": pa.array([[0.1, -0.0], [1e-7, 3.0], None, None, None, None, [1.5, 1e20], None], pa.list_(pa.float32())),
            "il": pa.array([[1, -2], [], None, None, None, None, [2**62], None], pa.list_(pa.int64())),
            "sl": pa.array([["x", 'y"'], [], None, None, None, None, ["é"], None], pa.list_(pa.string())),
        }
    )


EXPECTED = [
    '{"f":0.1,"f32":0.1,"n":-9223372036854775808,"b":true,"s":"a\\"b\\\\c","e":[0.1,0],"il":[1,-2],"sl":["x","y\\""]}',
    '{"f":0,"f32":1e-07,"n":9223372036854775807,"b":false,"s":"tab\\there","e":[1e-07,3],"il":[],"sl":[]}',
    '{"f":1e+22,"n":0,"s":"日本\u2028"}',
    '{"f32":16777216}',
    "{}",
    '{"f":3,"s":"\\u0001"}',
    '{"f":1e-07,"f32":2.5,"n":7,"b":true,"s":"","e":[1.5,1e+20],"il":[4611686018427387904],"sl":["é"]}',
    "{}",
]


def test_json_maps_golden_text():
    maps, non_finite = encode_json_maps(batch(), SPECS)
    assert maps.to_pylist() == EXPECTED
    assert non_finite.tolist() == [0, 0, 0, 1, 0, 0, 0, 1]  # NaN and -inf are left out and counted
    for text in EXPECTED:
        json.loads(text)  # every object is valid JSON


def test_json_maps_of_a_slice_match_the_whole():
    whole = batch()
    maps, _ = encode_json_maps(whole.slice(3, 4).to_batches()[0], SPECS)
    assert maps.to_pylist() == EXPECTED[3:7]


def test_dialect_from_version():
    assert dialect_from_version("CockroachDB CCL v24.1.2 (x86_64-pc-linux-gnu, built 2024/06/24)") == "cockroach"
    assert dialect_from_version("PostgreSQL 15.18 (Debian 15.18-0+deb12u1) on x86_64-pc-linux-gnu") == "postgres"


def test_upsert_text_is_conditional_on_as_of_in_both_dialects():
    # CockroachDB's blind UPSERT would let an older snapshot replace a newer one: both
    # dialects send the conditional form (valid on CockroachDB too)
    table = table_identifier("consumer_features")
    assert upsert(table, 2).as_string(None) == (
        'INSERT INTO "consumer_features" AS stored ("entity_key", "source", "features", "as_of") '
        "VALUES (%s, %s, %s::JSONB, %s), (%s, %s, %s::JSONB, %s) "
        "ON CONFLICT (entity_key, source) DO UPDATE SET features = excluded.features, as_of = excluded.as_of "
        "WHERE stored.as_of <= excluded.as_of"
    )
    # the rows it left, sent again: only a stored as_of beyond the horizon (the last parameter) is replaced
    assert upsert(table, 1, beyond_horizon=True).as_string(None) == (
        'INSERT INTO "consumer_features" AS stored ("entity_key", "source", "features", "as_of") '
        "VALUES (%s, %s, %s::JSONB, %s) "
        "ON CONFLICT (entity_key, source) DO UPDATE SET features = excluded.features, as_of = excluded.as_of "
        "WHERE stored.as_of > %s"
    )


def test_create_table_text_per_dialect():
    table = table_identifier("store_features", "fm")
    assert create_table(table, "cockroach").as_string(None) == (
        'CREATE TABLE IF NOT EXISTS "fm"."store_features" (entity_key STRING NOT NULL, source STRING NOT NULL, '
        "features JSONB NOT NULL, as_of TIMESTAMPTZ NOT NULL, PRIMARY KEY (entity_key, source))"
    )
    assert "entity_key TEXT NOT NULL, source TEXT NOT NULL" in create_table(table, "postgres").as_string(None)


def test_split_at_text_with_quantiles_and_expiration():
    keys = quantile_keys([f"{i:03d}" for i in range(100)], 4)
    assert keys == ["020", "040", "060", "080"]
    expires = dt.datetime(2026, 11, 22, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert split_at(table_identifier("consumer_features"), keys, expires).as_string(None) == (
        "ALTER TABLE \"consumer_features\" SPLIT AT VALUES ('020'), ('040'), ('060'), ('080') WITH EXPIRATION '2026-11-21 23:30:00+00:00'"
    )
    # keys are quoted as SQL literals
    assert "('o''brien')" in split_at(table_identifier("t"), ["o'brien"], expires).as_string(None)


def test_quantile_keys_edge_cases():
    assert quantile_keys([], 3) == []
    assert quantile_keys(["a", "b"], 0) == []
    assert quantile_keys(["a", "a", "a", "b"], 3) == ["a", "b"]  # repeated keys give one split


@pytest.mark.parametrize("name", ["bad-name", "1table", "x" * 64, 'a"b'])
def test_table_identifier_refuses_invalid_names(name):
    with pytest.raises(ValueError, match="not a valid SQL identifier"):
        table_identifier(name)


def test_transient_classification():
    import psycopg.errors as pe

    assert is_transient(pe.SerializationFailure("x"))  # 40001
    assert is_transient(pe.DeadlockDetected("x"))  # 40P01
    assert is_transient(pe.AdminShutdown("x"))  # 57P01, pg_terminate_backend
    assert is_transient(pe.OperationalError("server closed the connection unexpectedly"))
    assert not is_transient(pe.InvalidTextRepresentation("x"))  # bad data: terminal
    assert not is_transient(pe.UniqueViolation("x"))
    assert not is_transient(ValueError("x"))
