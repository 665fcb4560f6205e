"""End to end into a real PostgreSQL (the CockroachDB stand-in), read back raw as JSONB text."""

from __future__ import annotations

import datetime as dt
import json
import math
import threading
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pytest

from feature_defs import load_definitions
from fm_config.sql import SqlSettings
from jobs.pipeline.gate.stage import BadInputError
from jobs.pipeline.run import run_source
from jobs.pipeline.write_sql import split_keys
from jobs.transforms import JSON_MAP, REASONS, is_bad, with_json_maps
from serializers import decode, field_id
from sinks.errors import SinkError, TerminalSinkError, TransientSinkError
from sinks.sql.config import sql_sink_config
from sinks.sql.preflight import ensure_schema
from sinks.sql.upserts import SqlSink
from stores.sql import connect

from .expected import entity_keys, is_null
from .support.consumer_job import (
    AS_OF_DAY2,
    CONSUMER,
    DAY1,
    DAY2,
    DEFS,
    STALL_AT_ROW,
    STORE,
    check_consumer_rows,
    expected_consumers,
    install_stall_trigger,
    source_rows,
    table_rows,
    written,
)


def test_consumer_snapshot_round_trips_through_jsonb(spark, sample_root, sql_conf, pg_db):
    summary = run_source(spark, sql_conf, DEFS, "consumer_daily", DAY2)
    expected = expected_consumers(spark, sample_root, DAY2)
    assert summary.status == "succeeded"
    checked = check_consumer_rows(pg_db, expected, AS_OF_DAY2)
    assert checked > 20 * len(expected)  # most of the 30 features are set
    assert {f.type for f in CONSUMER.features} == {"float", "int", "bool", "string", "embedding", "int_list", "string_list"}
    stats = summary.sinks["sql"]
    assert stats["dialect"] == "postgres" and stats["table"] == "consumer_features"
    assert list(summary.stages) == ["read", "prepare", "quarantine", "gate", "sql checks", "write sql", "verify", "report"]
    assert stats["rows_upserted"] == len(expected) == summary.entities
    assert stats["statements"] >= math.ceil(len(expected) / 25) and stats["retries"] == 0
    assert "redis" not in summary.sinks  # --sink sql writes only the SQL store


def test_long_layout_round_trips_through_jsonb(spark, sample_root, sql_conf, pg_db):
    summary = run_source(spark, sql_conf, DEFS, "store_features_long", DAY2)
    pdf = source_rows(spark, sample_root, "store_features_long", DAY2)
    good = pdf[pdf["store_id"].notna() & ~pdf["store_id"].fillna("").str.contains(":")]
    latest = good.sort_values("event_ts").groupby(["store_id", "feature_name"]).tail(1)
    rows = table_rows(pg_db, "store_features")
    assert len(rows) == summary.entities == good["store_id"].nunique()
    names = {f.name for f in STORE.features}
    expected: dict[str, dict] = {}
    for _, r in latest.iterrows():
        if r["feature_name"] in names and not is_null(r["value"]):
            kind = STORE.feature(r["feature_name"]).type
            expected.setdefault(r["store_id"], {})[r["feature_name"]] = {"float": float, "int": int, "bool": bool}[kind](r["value"])
    assert {k: v[1] for k, v in rows.items() if v[1]} == expected


def test_null_feature_leaves_the_map_and_rerun_is_identical(spark, sample_root, sql_conf, pg_db):
    run_source(spark, sql_conf, DEFS, "consumer_daily", DAY1)
    day1 = expected_consumers(spark, sample_root, DAY1)
    day2 = expected_consumers(spark, sample_root, DAY2)
    became_null = [
        (cid, f.name) for cid in set(day1) & set(day2) for f in CONSUMER.features
        if written(f, day1[cid][f.name]) and not written(f, day2[cid][f.name])
    ]  # fmt: skip
    assert len(became_null) > 10
    rows = table_rows(pg_db, "consumer_features")
    assert all(name in rows[str(cid)][1] for cid, name in became_null)
    run_source(spark, sql_conf, DEFS, "consumer_daily", DAY2)
    rows = table_rows(pg_db, "consumer_features")
    assert not [(cid, name) for cid, name in became_null if name in rows[str(cid)][1]]
    raw = pg_db.execute("SELECT entity_key, source, features::text, as_of FROM consumer_features ORDER BY 1").fetchall()
    run_source(spark, sql_conf, DEFS, "consumer_daily", DAY2)
    assert pg_db.execute("SELECT entity_key, source, features::text, as_of FROM consumer_features ORDER BY 1").fetchall() == raw


def test_backend_killed_mid_write_is_retried_and_table_is_complete(spark, sample_root, sql_conf, pg_server, pg_db):
    conf = sql_sink_config(sql_conf, CONSUMER, DEFS.entity_of(CONSUMER), DAY2)
    ensure_schema(pg_db, conf)
    install_stall_trigger(pg_db)
    killed: list[int] = []

    def killer() -> None:
        with pg_server.connect() as conn:
            deadline = time.monotonic() + 120
            while not killed and time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' AND application_name = 'feature-materializer'"
                ).fetchone()
                if row:
                    conn.execute("SELECT pg_terminate_backend(%s)", row)
                    killed.append(row[0])
                time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    summary = run_source(spark, sql_conf, DEFS, "consumer_daily", DAY2)
    thread.join(timeout=5)
    assert len(killed) == 1, "the stalled backend was never seen"
    stats = summary.sinks["sql"]
    assert stats["retries"] >= 1 and stats["reconnects"] >= 1
    assert pg_db.execute("SELECT last_value FROM rows_seen").fetchone()[0] > STALL_AT_ROW  # the write went on after the kill
    check_consumer_rows(pg_db, expected_consumers(spark, sample_root, DAY2), AS_OF_DAY2)


def install_failing_trigger(conn, key: str, sqlstate: str) -> None:
    conn.execute("CREATE SEQUENCE attempts")
    conn.execute(
        "CREATE FUNCTION fail_key() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        f"IF NEW.entity_key = '{key}' THEN PERFORM nextval('attempts'); "
        f"RAISE EXCEPTION 'injected failure' USING ERRCODE = '{sqlstate}'; END IF; RETURN NEW; END $$"
    )
    conn.execute("CREATE TRIGGER fail_key BEFORE INSERT ON consumer_features FOR EACH ROW EXECUTE FUNCTION fail_key()")


@pytest.mark.parametrize(
    ("sqlstate", "attempts", "wording", "kind"),
    [("40001", 3, "still failing after 3 attempts", TransientSinkError), ("22023", 1, "failed (not retried)", TerminalSinkError)],
)
def test_failing_batch_is_retried_boundedly_then_fails_typed(spark, sql_conf, pg_db, sqlstate, attempts, wording, kind):
    conf = sql_conf.model_copy(update={"sql": sql_conf.sql.model_copy(update={"retries": 2})})
    ensure_schema(pg_db, sql_sink_config(conf, CONSUMER, DEFS.entity_of(CONSUMER), DAY2))
    install_failing_trigger(pg_db, "42", sqlstate)
    with pytest.raises(SinkError) as info:
        run_source(spark, conf, DEFS, "consumer_daily", DAY2)
    assert type(info.value) is kind  # transient (a later run may succeed) or terminal, as the store reported it
    message = str(info.value)
    assert "consumer_features" in message and wording in message and f"[{sqlstate}]" in message
    first, last = message.split("keys '")[1].split("'")[0], message.split("..'")[1].split("'")[0]
    assert first <= "42" <= last  # the batch named is the one holding the key
    assert pg_db.execute("SELECT last_value FROM attempts").fetchone()[0] == attempts
    report = json.loads(Path(conf.reports_path, "consumer_daily", str(DAY2), "summary.json").read_text())
    assert report["status"] == "failed" and "consumer_features" in report["error"]


def write_things(spark, tmp_path, rows) -> object:
    """A tiny source 'things' (string key, a string list and a float) with its own definitions."""
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "entities.yaml").write_text(
        "entities:\n  - name: thing\n    prefix: t\n    keys: [{name: thing_id, type: string}]\n    sql_table: thing_features\n"
    )
    (folder / "things.yaml").write_text(
        "source:\n  name: things\n  entity: thing\n  location: things\n  layout: wide\n"
        "  features:\n    - {name: tags, type: string_list}\n    - {name: score, type: float}\n"
    )
    schema = "thing_id string, tags array<string>, score double, ds date"
    spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(str(tmp_path / "things"))
    return load_definitions(folder)


def test_oversized_map_is_quarantined_and_the_rest_written(spark, sql_conf, pg_db, tmp_path):
    huge = ["x" * 1000] * 600  # about 600 KB of JSON, over the 512 KiB default
    rows = [
        ("t1", ["a", "b"], 1.5, DAY2),
        ("t2", huge, 2.0, DAY2),
        ("t3", None, None, DAY2),
        ("t4", ["c"], float("nan"), DAY2),
        ("t5", ["ok", "a\x00b"], 1.0, DAY2),  # PostgreSQL's JSONB cannot store U+0000
    ]
    defs = write_things(spark, tmp_path, rows)
    conf = sql_conf.model_copy(
        update={"data_root": str(tmp_path), "quality": sql_conf.quality.model_copy(update={"max_bad_fraction": 0.5})}
    )
    summary = run_source(spark, conf, defs, "things", DAY2)
    reason = "features JSON larger than 524,288 bytes (sql.max_map_bytes)"
    nul = "tags: NUL character (not storable in JSONB)"
    assert summary.bad_rows == 2 and summary.bad_reasons == {reason: 1, nul: 1}
    rows_out = table_rows(pg_db, "thing_features")
    assert {k: v[1] for k, v in rows_out.items()} == {"t1": {"tags": ["a", "b"], "score": 1.5}, "t3": {}, "t4": {"tags": ["c"]}}
    assert summary.sinks["sql"]["non_finite"] == 1  # the NaN score is left out and counted
    sent = ['{"tags":["a","b"],"score":1.5}', "{}", '{"tags":["c"]}']
    assert summary.sinks["sql"]["bytes_sent"] == sum(len(t) for t in sent)
    quarantined = spark.read.format("delta").load(summary.quarantine_table).collect()
    assert sorted((json.loads(r["row"])["thing_id"], list(r["reasons"])) for r in quarantined) == [("t2", [reason]), ("t5", [nul])]
    # with the quality gate at the suite's 5%, two bad rows in five stop the run before writing
    pg_db.execute("DELETE FROM thing_features")
    with pytest.raises(BadInputError):
        run_source(spark, sql_conf.model_copy(update={"data_root": str(tmp_path)}), defs, "things", DAY2)
    assert table_rows(pg_db, "thing_features") == {}


def test_map_size_limit_is_exact_in_bytes(spark, tmp_path):
    defs = write_things(spark, tmp_path, [("t1", ["é"], 1.5, DAY2)])
    text = '{"tags":["é"],"score":1.5}'  # 27 bytes: é is two bytes in UTF-8
    df = spark.createDataFrame([("t1", ["é"], 1.5, [])], f"thing_id string, tags array<string>, score double, {REASONS} array<string>")
    source = defs.sources["things"]
    at_limit = with_json_maps(df, source, len(text.encode()))
    assert at_limit.select(JSON_MAP, is_bad(at_limit)).first() == (text, False)
    over = with_json_maps(df, source, len(text.encode()) - 1)
    assert over.select(is_bad(over)).first()[0] is True


def test_split_keys_are_quantiles_of_the_keys_to_write(spark):
    keys = spark.createDataFrame([(f"k{i:03d}",) for i in range(100)], "_id string").repartition(3)
    assert split_keys(keys, 4, 100) == ["k020", "k040", "k060", "k080"]  # a small input is sampled whole
    many = spark.range(20_000).selectExpr("lpad(cast(id as string), 5, '0') as _id")
    picked = [int(k) for k in split_keys(many, 3, 20_000)]
    for got, want in zip(picked, (5_000, 10_000, 15_000)):
        assert abs(got - want) < 2_000  # from a sample of a few hundred keys, not a full collect


def test_unreachable_sql_store_is_a_clear_error(spark, sql_conf):
    conf = sql_conf.model_copy(update={"sql": SqlSettings(dsn="postgresql://postgres@127.0.0.1:1/features", connect_timeout=2)})
    with pytest.raises(TerminalSinkError, match=r"cannot connect to the SQL store \(postgresql://postgres@127.0.0.1:1/features\)"):
        run_source(spark, conf, DEFS, "store_features_long", DAY2)


def test_existing_table_with_another_layout_is_refused(sql_conf, pg_db):
    pg_db.execute("CREATE TABLE consumer_features (entity_key text PRIMARY KEY, payload jsonb)")
    conf = sql_sink_config(sql_conf, CONSUMER, DEFS.entity_of(CONSUMER), DAY2)
    with connect(conf) as conn, pytest.raises(TerminalSinkError, match="without the column.s. source, features, as_of"):
        ensure_schema(conn, conf)


@pytest.mark.parametrize("sizes", [[1] * 6, [2, 2, 2], [4, 2]], ids=["rows", "a repeat across batches", "a repeat within a batch"])
@pytest.mark.parametrize(("per_transaction", "transactions"), [(20, 1), (2, 2), (1, 3)])
def test_sink_dedups_sorted_keys_last_wins_and_batches(sql_conf, pg_db, per_transaction, transactions, sizes):
    conf = replace(
        sql_sink_config(sql_conf, CONSUMER, DEFS.entity_of(CONSUMER), DAY2), batch_rows=2, statements_per_transaction=per_transaction
    )
    ensure_schema(pg_db, conf)
    rows = [("a", '{"n":1}'), ("b", '{"n":2}'), ("b", '{"n":3}'), ("c", "{}"), ("d", '{"s":"x"}'), ("e", '{"n":5}')]
    with SqlSink(conf) as sink:
        start = 0
        for size in sizes:  # Arrow batches, as the partition writer sends them
            keys, docs = zip(*rows[start : start + size])
            sink.write_batch(pa.array(keys), pa.array(docs))
            start += size
        sink.flush()
    assert {k: v[1] for k, v in table_rows(pg_db, "consumer_features").items()} == {
        "a": {"n": 1},
        "b": {"n": 3},
        "c": {},
        "d": {"s": "x"},
        "e": {"n": 5},
    }
    assert (sink.stats.rows_upserted, sink.stats.duplicates, sink.stats.statements) == (5, 1, 3)
    assert sink.stats.transactions == transactions


def test_hostile_keys_and_values_are_data_not_sql(spark, sql_conf, pg_db, redis_db, tmp_path):
    """Keys and values reach both stores as parameters and RESP bulk strings, never as SQL or commands."""
    injection = "x'); DROP TABLE thing_features; --"
    rows = [
        (injection, ["'; DELETE FROM thing_features; --", '"}]'], 1.0, DAY2),
        ("ünï $1 %s {}", ["\r\nFLUSHALL\r\n"], 2.0, DAY2),
        ("a:b", ["colon"], 3.0, DAY2),  # ':' would split the Redis key: bad input
        ("tab\there", ["ctl"], 4.0, DAY2),  # control character: bad input
    ]
    defs = write_things(spark, tmp_path, rows)
    quality = sql_conf.quality.model_copy(update={"max_bad_fraction": 0.5})
    conf = sql_conf.model_copy(update={"data_root": str(tmp_path), "sinks": ["redis", "sql"], "quality": quality})
    summary = run_source(spark, conf, defs, "things", DAY2)
    assert summary.bad_reasons == {"key thing_id contains ':'": 1, "key thing_id contains a control character": 1}
    assert {k: v[1] for k, v in table_rows(pg_db, "thing_features").items()} == {
        injection: {"tags": ["'; DELETE FROM thing_features; --", '"}]'], "score": 1.0},
        "ünï $1 %s {}": {"tags": ["\r\nFLUSHALL\r\n"], "score": 2.0},
    }
    assert sorted(entity_keys(redis_db)) == sorted([f"t:{injection}".encode(), "t:ünï $1 %s {}".encode()])
    tags = redis_db.hget("t:ünï $1 %s {}".encode(), field_id("tags"))
    assert decode("string_list", tags) == ["\r\nFLUSHALL\r\n"]


def test_rows_of_a_range_carry_their_own_as_of(sql_conf, pg_db):
    """Range runs send each row's as-of epoch with it (a backfill's latest date per entity)."""
    conf = sql_sink_config(sql_conf, CONSUMER, DEFS.entity_of(CONSUMER), DAY2)
    ensure_schema(pg_db, conf)
    with SqlSink(conf) as sink:
        sink.write_batch(
            pa.array(["x", "y", "y"]), pa.array(['{"n":1}', '{"n":2}', '{"n":3}']), pa.array([1795132800, 1795219200, 1795219200])
        )
        sink.flush()
    rows = dict(pg_db.execute("SELECT entity_key, as_of FROM consumer_features").fetchall())
    assert rows == {"x": dt.datetime(2026, 11, 20, tzinfo=dt.UTC), "y": dt.datetime(2026, 11, 21, tzinfo=dt.UTC)}
    assert sink.stats.duplicates == 1
