"""End to end: sample Delta tables -> the job -> a real redis-server, read back raw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feature_defs import load_definitions
from jobs.pipeline.gate.stage import BadInputError
from jobs.pipeline.run import run_source
from jobs.transforms import SchemaDriftError
from serializers import decode, field_id
from sinks.errors import CapacityError
from throwaway.servers import start_redis

from .expected import entity_count, is_null
from .support.consumer_job import CONSUMER, DAY1, DAY2, DEFS, STORE, check_consumer_hashes, expected_consumers, source_rows
from .support.samples import tiny_consumer_source


def test_consumer_snapshot_round_trips_through_redis(spark, sample_root, run_conf, redis_db):
    summary = run_source(spark, run_conf, DEFS, "consumer_daily", DAY2)
    expected = expected_consumers(spark, sample_root, DAY2)
    assert summary.status == "succeeded"
    assert summary.entities == len(expected) == entity_count(redis_db)
    checked = check_consumer_hashes(redis_db, expected, DAY2)
    assert summary.sinks["redis"]["values_set"] == checked
    assert summary.sinks["redis"]["memory_after"] > summary.sinks["redis"]["memory_before"]
    ttl = redis_db.ttl(f"c:{next(iter(expected))}")
    assert 2592000 * 0.99 <= ttl <= 2592000 * 1.1
    assert Path(run_conf.reports_path, "consumer_daily", str(DAY2), "summary.json").is_file()
    # the stages in run order; together they are the run, less the bookkeeping between them
    assert list(summary.stages) == ["read", "prepare", "quarantine", "gate", "write redis", "verify", "report"]
    assert all(s >= 0 for s in summary.stages.values())
    assert 0.8 * summary.seconds <= sum(summary.stages.values()) <= summary.seconds
    assert summary.sinks["redis"]["write_seconds"] <= summary.stages["write redis"]


def test_null_deletes_field_other_source_untouched_and_rerun_identical(spark, sample_root, run_conf, redis_db):
    other = {field_id("some_other_feature"): b"42", field_id("_ts:other_source"): b"1700000000"}
    for cid in range(1, 400):
        redis_db.hset(f"c:{cid}", mapping=other)
    run_source(spark, run_conf, DEFS, "consumer_daily", DAY1)
    day1 = expected_consumers(spark, sample_root, DAY1)
    day2 = expected_consumers(spark, sample_root, DAY2)
    # features set on day 1 and null on day 2 must be gone after the day-2 run
    became_null = [
        (cid, f.name) for cid in set(day1) & set(day2) for f in CONSUMER.features
        if not is_null(day1[cid][f.name]) and is_null(day2[cid][f.name])
    ]  # fmt: skip
    assert len(became_null) > 10
    for cid, name in became_null:
        assert redis_db.hexists(f"c:{cid}", field_id(name))
    summary = run_source(spark, run_conf, DEFS, "consumer_daily", DAY2)
    assert summary.sinks["redis"]["values_deleted"] >= len(became_null)
    for cid, name in became_null:
        assert not redis_db.hexists(f"c:{cid}", field_id(name))
    for cid in range(1, 400):
        raw = redis_db.hgetall(f"c:{cid}")
        assert {k: raw[k] for k in other} == other  # another source's fields are never touched
    snapshot = {k: (redis_db.hgetall(k), redis_db.ttl(k)) for k in redis_db.scan_iter()}
    run_source(spark, run_conf, DEFS, "consumer_daily", DAY2)
    again = {k: (redis_db.hgetall(k), redis_db.ttl(k)) for k in redis_db.scan_iter()}
    assert {k: v[0] for k, v in again.items()} == {k: v[0] for k, v in snapshot.items()}
    assert all(abs(again[k][1] - snapshot[k][1]) <= 60 for k in snapshot if snapshot[k][1] > 0)


def test_long_layout_store_features(spark, sample_root, run_conf, redis_db):
    summary = run_source(spark, run_conf, DEFS, "store_features_long", DAY2)
    pdf = source_rows(spark, sample_root, "store_features_long", DAY2)
    good = pdf[pdf["store_id"].notna() & ~pdf["store_id"].fillna("").str.contains(":")]
    assert summary.ignored_rows == int((good["feature_name"] == "experimental_score").sum())
    latest = good.sort_values("event_ts").groupby(["store_id", "feature_name"]).tail(1)
    assert summary.entities == good["store_id"].nunique() == entity_count(redis_db)
    for _, r in latest.iterrows():
        if r["feature_name"] not in [f.name for f in STORE.features]:
            continue
        feature = STORE.feature(r["feature_name"])
        raw = redis_db.hget(f"s:{r['store_id']}", field_id(feature.name))
        expected = {"float": r["value"], "int": int(r["value"]), "bool": bool(r["value"])}[feature.type]
        assert decode(feature.type, raw) == expected
    assert summary.bad_reasons == {"key store_id contains ':'": 1, "null key store_id": 1}


def test_bad_rows_are_quarantined_and_counted(spark, run_conf, redis_db):
    summary = run_source(spark, run_conf, DEFS, "consumer_daily", DAY2)
    assert summary.bad_rows == 3
    assert summary.bad_reasons == {
        "null key consumer_id": 1,
        "taste_embedding: embedding dimension is not 32": 1,
        "favorite_cuisine: longer than 32 characters": 1,
    }
    q = spark.read.format("delta").load(summary.quarantine_table).where(f"ds = '{DAY2}'").toPandas()
    assert sorted(r[0] for r in q["reasons"]) == sorted(summary.bad_reasons)
    assert all('"updated_at"' in row for row in q["row"])  # the whole original row is kept
    # rerun replaces, not appends
    run_source(spark, run_conf, DEFS, "consumer_daily", DAY2)
    assert spark.read.format("delta").load(summary.quarantine_table).where(f"ds = '{DAY2}'").count() == 3


def test_a_rerun_with_no_bad_rows_clears_the_dates_quarantine_and_keeps_others(spark, run_conf, redis_db, tmp_path):
    """No bad rows: no quarantine write, but a date's earlier quarantined rows do not outlive its fixed rerun."""
    features, schema = "    - {name: score, type: float, precision: float32}\n", "consumer_id long, score double, ds date"
    bad = [(1, 1.0, DAY1), (2, 1e300, DAY1), (1, 2.0, DAY2), (2, 1e300, DAY2)]  # 1e300: beyond float32
    defs = tiny_consumer_source(spark, tmp_path, features, schema, bad)
    conf = run_conf.model_copy(
        update={"data_root": str(tmp_path), "quality": run_conf.quality.model_copy(update={"max_bad_fraction": 0.5})}
    )
    first = [run_source(spark, conf, defs, "tiny", day) for day in (DAY1, DAY2)]
    assert [s.bad_rows for s in first] == [1, 1]
    table = first[0].quarantine_table

    def quarantined(day):
        return spark.read.format("delta").load(table).where(f"ds = '{day}'").count()

    assert (quarantined(DAY1), quarantined(DAY2)) == (1, 1)
    tiny_consumer_source(spark, tmp_path, features, schema, [(1, 1.0, DAY1), (2, 1e300, DAY1), (1, 2.0, DAY2), (2, 3.0, DAY2)])
    fixed = run_source(spark, conf, defs, "tiny", DAY2)
    assert (fixed.bad_rows, fixed.bad_reasons, fixed.quarantine_table) == (0, {}, table)
    assert (quarantined(DAY1), quarantined(DAY2)) == (1, 0)
    assert decode("float", redis_db.hget("c:2", field_id("score"))) == 3.0


def test_a_source_never_bad_has_an_empty_quarantine_table(spark, run_conf, redis_db, tmp_path):
    defs = tiny_consumer_source(
        spark, tmp_path, "    - {name: score, type: float}\n", "consumer_id long, score double, ds date", [(1, 1.0, DAY1)]
    )
    summary = run_source(spark, run_conf.model_copy(update={"data_root": str(tmp_path)}), defs, "tiny", DAY1)
    assert (summary.status, summary.bad_rows, summary.quarantine_table) == ("succeeded", 0, str(tmp_path / "quarantine" / "tiny"))
    table = spark.read.format("delta").load(summary.quarantine_table)
    assert table.count() == 0 and table.columns == ["source", "ds", "stage", "reasons", "row"]


def test_too_many_bad_rows_fail_before_writing(spark, run_conf, redis_db):
    strict = run_conf.model_copy(update={"quality": run_conf.quality.model_copy(update={"max_bad_fraction": 0.001})})
    with pytest.raises(BadInputError, match=r"3 of .* rows are bad input.*nothing was written"):
        run_source(spark, strict, DEFS, "consumer_daily", DAY2)
    assert redis_db.dbsize() == 0


def dump_all(client) -> dict:
    return {k: client.dump(k) for k in client.scan_iter()}


def test_capacity_refusal_leaves_redis_unchanged(spark, run_conf, tmp_path):
    server = start_redis(tmp_path / "small", "--maxmemory", "1200000")
    try:
        client = server.client()
        client.hset("c:1", mapping={b"x": b"1"})
        client.set("unrelated", "value")
        before = dump_all(client)
        conf = run_conf.model_copy(update={"redis": run_conf.redis.model_copy(update={"url": server.url})})
        with pytest.raises(CapacityError, match=r"refusing to write .* consumer entities.*Nothing was written"):
            run_source(spark, conf, DEFS, "consumer_daily", DAY2)
        assert dump_all(client) == before
        # the summary is written on failure too; this server keeps the default 64-byte
        # listpack limit, so the 131-byte embeddings are predicted to force hashtables
        report = json.loads(Path(conf.reports_path, "consumer_daily", str(DAY2), "summary.json").read_text())
        assert report["status"] == "failed" and "CapacityError" in report["error"]
        assert report["sinks"]["redis"]["predicted_encoding"] == "hashtable"
        assert any("exceed hash-max-listpack-value 64" in w and "131 B" in w for w in report["warnings"])
    finally:
        server.stop()


def test_hard_ceiling_stops_the_write_and_says_how_much(spark, run_conf, tmp_path):
    server = start_redis(tmp_path / "ceiling", "--maxmemory", "4000000")
    try:
        used = int(server.client().info("memory")["used_memory"])
        redis_conf = run_conf.redis.model_copy(
            update={
                "url": server.url,
                "max_fill": 1.0,
                "hard_fill": (used + 200_000) / 4_000_000,
                "recheck_every": 1,
                "pipeline_entities": 16,
            }
        )
        conf = run_conf.model_copy(update={"redis": redis_conf})
        with pytest.raises(CapacityError, match=r"stopped at the memory ceiling.* of \d+ entities .* were written") as info:
            run_source(spark, conf, DEFS, "consumer_daily", DAY2)
        written = entity_count(server.client())
        assert 0 < written < 290
        assert f"{written:,} of" in str(info.value)
    finally:
        server.stop()


def test_schema_drift_fails_before_writing(spark, sample_root, run_conf, redis_db, tmp_path):
    folder = tmp_path / "defs"
    folder.mkdir()
    for path in DEFS.files.values():
        (folder / path.name).write_text(path.read_text())
    text = (
        (folder / "consumer_daily.yaml")
        .read_text()
        .replace("{name: orders_7d, type: int}", "{name: orders_7d, type: int, column: orders_7days}")
    )
    (folder / "consumer_daily.yaml").write_text(text.replace("{name: is_subscriber, type: bool}", "{name: is_subscriber, type: string}"))
    defs = load_definitions(folder)
    with pytest.raises(SchemaDriftError) as info:
        run_source(spark, run_conf, defs, "consumer_daily", DAY2)
    assert "column 'orders_7days' is missing" in str(info.value)
    assert "column 'is_subscriber' has type boolean, expected string" in str(info.value)
    assert redis_db.dbsize() == 0


def test_non_finite_floats_are_not_written_and_counted(spark, run_conf, redis_db, tmp_path):
    rows = [(1, float("nan"), DAY2), (2, float("inf"), DAY2), (3, 0.5, DAY2)]
    defs = tiny_consumer_source(spark, tmp_path, "    - {name: score, type: float}\n", "consumer_id long, score double, ds date", rows)
    conf = run_conf.model_copy(update={"data_root": str(tmp_path)})
    summary = run_source(spark, conf, defs, "tiny", DAY2)
    assert summary.sinks["redis"]["non_finite"] == 2
    assert redis_db.hget("c:1", field_id("score")) is None
    assert redis_db.hget("c:3", field_id("score")) == b"0.5"
