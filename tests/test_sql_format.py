"""The SQL store's bytes and statements, pinned as fixed text (no server needed)."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

from serializers.batch import FeatureSpec
from serializers.json_map import encode_json_maps
from sinks.sql.statements import (
    add_expiry_column,
    create_table,
    dialect_from_version,
    follow_expiry,
    quantile_keys,
    set_row_ttl,
    split_at,
    table_identifier,
    upsert,
)
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


def test_float_list_json_text():
    # each element by the float rule (FORMAT.md, SQL layout): whole numbers without ".0", exponent forms as Python's repr;
    # float32 in the shortest digits of the float32 value (0.1, not 0.10000000149011612)
    specs = [FeatureSpec("v", "float_list"), FeatureSpec("w", "float_list", {"precision": "float32", "compression": "snappy"})]
    table = pa.table(
        {
            "v": pa.array([[1.0, 0.5], [-2.5, 1e-07, 3.0], [], None, [-0.0, 1e22, 1e16, 123456789012345.67]], pa.list_(pa.float64())),
            "w": pa.array([[1.0, 0.1], None, [], [1 / 3, 3.4e38], [16777217.0]], pa.list_(pa.float32())),
        }
    )
    maps, non_finite = encode_json_maps(table, specs)
    assert maps.to_pylist() == [
        '{"v":[1,0.5],"w":[1,0.1]}',
        '{"v":[-2.5,1e-07,3]}',
        '{"v":[],"w":[]}',
        '{"w":[0.33333334,3.4e+38]}',
        '{"v":[0,1e+22,1e+16,123456789012345.67],"w":[16777216]}',
    ]
    assert non_finite.tolist() == [0] * 5


def test_dialect_from_version():
    assert dialect_from_version("CockroachDB CCL v24.1.2 (x86_64-pc-linux-gnu, built 2024/06/24)") == "cockroach"
    assert dialect_from_version("PostgreSQL 15.18 (Debian 15.18-0+deb12u1) on x86_64-pc-linux-gnu") == "postgres"


def test_upsert_text_is_conditional_on_as_of_in_both_dialects():
    # CockroachDB's blind UPSERT would let an older snapshot replace a newer one: both
    # dialects send the conditional form (valid on CockroachDB too); a row past its expiry
    # is gone, as its Redis key would be, and any snapshot replaces it
    table = table_identifier("consumer_features")
    assert upsert(table, 2).as_string(None) == (
        'INSERT INTO "consumer_features" AS stored ("entity_key", "source", "features", "as_of", "expires_at") '
        "VALUES (%s, %s, %s::JSONB, %s, now() + %s::FLOAT8 * INTERVAL '1 second'), "
        "(%s, %s, %s::JSONB, %s, now() + %s::FLOAT8 * INTERVAL '1 second') "
        "ON CONFLICT (entity_key, source) DO UPDATE SET features = excluded.features, as_of = excluded.as_of, "
        "expires_at = excluded.expires_at "
        "WHERE stored.as_of <= excluded.as_of OR stored.expires_at <= now() "
        "RETURNING entity_key"
    )
    # the rows it left, sent again: only a stored as_of beyond the horizon (the last parameter) is replaced
    assert upsert(table, 1, beyond_horizon=True).as_string(None) == (
        'INSERT INTO "consumer_features" AS stored ("entity_key", "source", "features", "as_of", "expires_at") '
        "VALUES (%s, %s, %s::JSONB, %s, now() + %s::FLOAT8 * INTERVAL '1 second') "
        "ON CONFLICT (entity_key, source) DO UPDATE SET features = excluded.features, as_of = excluded.as_of, "
        "expires_at = excluded.expires_at "
        "WHERE stored.as_of > %s "
        "RETURNING entity_key"
    )


def test_a_write_moves_the_expiry_of_the_entitys_other_sources_unless_gone():
    assert follow_expiry(table_identifier("consumer_features")).as_string(None) == (
        'UPDATE "consumer_features" AS other SET expires_at = mine.expires_at FROM "consumer_features" AS mine '
        "WHERE mine.entity_key = ANY(%(keys)s) AND mine.source = %(source)s "
        "AND other.entity_key = ANY(%(keys)s) AND other.source <> %(source)s AND other.entity_key = mine.entity_key "
        "AND (other.expires_at IS NULL OR other.expires_at > now()) "
        "AND other.expires_at IS DISTINCT FROM mine.expires_at"
    )


def test_create_table_text_per_dialect():
    table = table_identifier("store_features", "fm")
    # CockroachDB: its TTL job deletes the rows past expires_at (a NULL never expires)
    assert create_table(table, "cockroach").as_string(None) == (
        'CREATE TABLE IF NOT EXISTS "fm"."store_features" (entity_key STRING NOT NULL, source STRING NOT NULL, '
        "features JSONB NOT NULL, as_of TIMESTAMPTZ NOT NULL, expires_at TIMESTAMPTZ, PRIMARY KEY (entity_key, source)) "
        "WITH (ttl_expiration_expression = 'expires_at', ttl_job_cron = '@daily')"
    )
    assert create_table(table, "postgres").as_string(None) == (
        'CREATE TABLE IF NOT EXISTS "fm"."store_features" (entity_key TEXT NOT NULL, source TEXT NOT NULL, '
        "features JSONB NOT NULL, as_of TIMESTAMPTZ NOT NULL, expires_at TIMESTAMPTZ, PRIMARY KEY (entity_key, source))"
    )


def test_cockroach_row_ttl_and_the_expiry_column_of_an_older_table():
    table = table_identifier("consumer_features")
    assert set_row_ttl(table).as_string(None) == (
        "ALTER TABLE \"consumer_features\" SET (ttl_expiration_expression = 'expires_at', ttl_job_cron = '@daily')"
    )
    # the rows already there expire one TTL from the change; no default is kept
    assert [s.as_string(None) for s in add_expiry_column(table, 2592000)] == [
        "ALTER TABLE \"consumer_features\" ADD COLUMN IF NOT EXISTS expires_at TIMESTAMPTZ DEFAULT now() + 2592000 * INTERVAL '1 second'",
        'ALTER TABLE "consumer_features" ALTER COLUMN expires_at DROP DEFAULT',
    ]
    assert [s.as_string(None) for s in add_expiry_column(table, None)] == [
        'ALTER TABLE "consumer_features" ADD COLUMN IF NOT EXISTS expires_at TIMESTAMPTZ'
    ]


def test_cleanup_statements_are_bounded_to_one_page_of_the_primary_key():
    from jobs.operations.cleanup.sql import expired_statement, page_query, removed_sources_statement, stale_keys_statement, strip_statement

    table = table_identifier("consumer_features")
    page = "(entity_key, source) > (%(after_key)s, %(after_source)s) AND (entity_key, source) <= (%(last_key)s, %(last_source)s)"
    assert page_query(table, first=False).as_string(None) == (
        'SELECT entity_key, source FROM "consumer_features" WHERE (entity_key, source) > (%(after_key)s, %(after_source)s) '
        "ORDER BY entity_key, source LIMIT %(limit)s"
    )
    assert page_query(table, first=True).as_string(None) == (
        'SELECT entity_key, source FROM "consumer_features" ORDER BY entity_key, source LIMIT %(limit)s'
    )
    assert removed_sources_statement(table, False, dry_run=False).as_string(None) == (
        f'DELETE FROM "consumer_features" WHERE {page} AND source <> ALL(%(defined)s) RETURNING source'
    )
    assert expired_statement(table, False, dry_run=False).as_string(None) == (
        f'DELETE FROM "consumer_features" WHERE {page} AND source = ANY(%(defined)s) AND expires_at <= now()'
    )
    assert expired_statement(table, True, dry_run=True).as_string(None) == (
        'SELECT count(*) FROM "consumer_features" WHERE (entity_key, source) <= (%(last_key)s, %(last_source)s) '
        "AND source = ANY(%(defined)s) AND expires_at <= now()"
    )
    assert stale_keys_statement(table, False, dry_run=False).as_string(None) == (
        f'SELECT entity_key, (features - %(stored)s::TEXT[])::TEXT FROM "consumer_features" WHERE {page} AND source = %(source)s '
        "AND (expires_at IS NULL OR expires_at > now()) AND features - %(stored)s::TEXT[] <> '{}'::JSONB FOR UPDATE"
    )
    assert strip_statement(table, False).as_string(None) == (
        f'UPDATE "consumer_features" SET features = features - %(stale)s::TEXT[] WHERE {page} '
        "AND source = %(source)s AND entity_key = ANY(%(keys)s)"
    )


def test_readers_leave_out_rows_past_their_expiry():
    from feature_reader.sql_reads import QUERY

    assert QUERY.endswith(" WHERE entity_key = ANY(%s) AND source = ANY(%s) AND (expires_at IS NULL OR expires_at > now())")


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
