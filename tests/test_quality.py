"""The data-quality gate (great-expectations), its reports, and post-write verification,
against the sample tables, a real redis-server and a real PostgreSQL."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from feature_defs import DEFAULT_DIR, DefinitionError, load_definitions
from fm_config import QualityConf
from fm_config.sql import SqlSettings
from jobs.cli import main
from jobs.pipeline.gate.checks import QualityGateError, VerificationError, derive_checks
from jobs.pipeline.report.stage import report_dir
from jobs.pipeline.run import run_source, validate_source
from serializers import field_id

from .support.confs import env_conf
from .support.consumer_job import CONSUMER, DAY1, DAY2, DEFS, source_rows
from .support.samples import TINY_SOURCE, tiny_consumer_source


@pytest.fixture
def gate_conf(run_conf, pg_server, pg_db):
    """Both stores, expectations on, every entity verified after the write."""
    sql = SqlSettings(dsn=pg_server.dsn, password_env=None, retry_base_delay=0.01)
    quality = run_conf.quality.model_copy(update={"expectations": True, "verify_sample": 10_000})
    return run_conf.model_copy(update={"sinks": ["redis", "sql"], "sql": sql, "quality": quality})


def page_text(path) -> str:
    raw = open(path, encoding="utf-8").read()
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", raw)))


def test_clean_date_passes_and_leaves_html_and_json_reports(spark, sample_root, gate_conf, redis_db, pg_db):
    summary = run_source(spark, gate_conf, DEFS, "consumer_daily", DAY2)
    assert summary.status == "succeeded"
    report = json.loads((Path(report_dir(gate_conf, "consumer_daily", DAY2)) / "summary.json").read_text())
    by_name = {e["name"]: e for e in report["expectations"]}
    for name in ("consumer_id not null", "entity key unique after de-duplication", "taste_embedding has dimension 32",
                 "favorite_cuisine null at most 30%", "churn_score in [0.0, 1.0]", "orders_7d is int"):  # fmt: skip
        assert by_name[name]["success"], name
    extra = by_name["expect_column_values_to_be_between(column=orders_7d, min_value=0, max_value=200)"]
    assert extra["severity"] == "warning" and extra["success"]

    # counts in the report, against the source rows counted here with pandas
    pdf = source_rows(spark, sample_root, "consumer_daily", DAY2)
    keyed = pdf[pdf["consumer_id"].notna()]
    latest = keyed.sort_values("updated_at").groupby("consumer_id").tail(1)
    unusable = int(pdf["consumer_id"].isna().sum())
    snapshot = len(latest) + unusable
    assert report["snapshot_entities"] == snapshot
    assert by_name["favorite_cuisine null at most 30%"]["element_count"] == snapshot
    nulls = int(latest["favorite_cuisine"].isna().sum()) + unusable
    assert by_name["favorite_cuisine null at most 30%"]["unexpected_count"] == nulls
    profile = report["profile"]
    assert profile["favorite_cuisine"]["null_fraction"] == pytest.approx(nulls / snapshot)
    assert profile["orders_7d"]["max"] == latest["orders_7d"].max() and profile["orders_7d"]["min"] == latest["orders_7d"].min()
    assert profile["orders_7d"]["zero_fraction"] == pytest.approx(int((latest["orders_7d"] == 0).sum()) / snapshot)
    assert profile["recent_store_ids"]["len_max"] == latest["recent_store_ids"].map(len).max()
    assert report["verification"]["redis"] == {"checked": summary.entities, "mismatches": 0, "newer": 0, "listed": []}
    assert report["verification"]["sql"]["mismatches"] == 0

    # the HTML data docs: index, and a validation page naming the checks with counts
    docs = Path(report_dir(gate_conf, "consumer_daily", DAY2)) / "data_docs"
    assert report["data_docs"] == str(docs / "index.html")
    pages = list((docs / "validations").rglob("*.html"))
    assert len(pages) == 1
    text = page_text(pages[0])
    n = len(report["expectations"])
    assert f"Evaluated Expectations {n} Successful Expectations {n} Unsuccessful Expectations 0" in text
    for column in ("_conflicts", "_dim_taste_embedding", "favorite_cuisine", "churn_score"):
        assert column in text
    suite_page = page_text(docs / "expectations" / "consumer_daily.html")
    assert "entity key unique after de-duplication (blocking)" in suite_page  # our names, as notes
    assert "orders_7d, min_value=0, max_value=200) (warning)" in suite_page


def violated_day2(spark, sample_root, tmp_path):
    """DAY2 of consumer_daily with injected violations, as its own Delta table."""
    df = spark.read.format("delta").load(str(sample_root / "consumer_daily"))
    day2 = df.where(F.col("ds") == DAY2)
    # 1. conflicting duplicates: same key and updated_at, another value
    dupes = day2.where("consumer_id % 25 = 0").withColumn("orders_7d", F.col("orders_7d") + 1)
    # 2. too many nulls: favorite_cuisine null for half the consumers
    nulls = F.when(F.col("consumer_id") % 2 == 0, F.lit(None)).otherwise(F.col("favorite_cuisine"))
    # 3. wrong dimension for a tenth of them
    short = F.when(F.col("consumer_id") % 10 == 3, F.slice("taste_embedding", 1, 31)).otherwise(F.col("taste_embedding"))
    bad = day2.unionByName(dupes).withColumn("favorite_cuisine", nulls).withColumn("taste_embedding", short)
    df.where(F.col("ds") == DAY1).unionByName(bad).write.format("delta").save(str(tmp_path / "consumer_daily"))
    return int(dupes.select("consumer_id").distinct().count())


def dump_stores(redis_db, pg_db) -> tuple:
    redis_state = {k: redis_db.dump(k) for k in redis_db.scan_iter()}
    sql_state = pg_db.execute("SELECT entity_key, source, features::text, as_of FROM consumer_features ORDER BY 1").fetchall()
    return redis_state, sql_state


def test_injected_violations_fail_the_gate_and_leave_both_stores_unchanged(spark, sample_root, gate_conf, redis_db, pg_db, tmp_path):
    conflicting = violated_day2(spark, sample_root, tmp_path)
    conf = gate_conf.model_copy(update={"data_root": str(tmp_path)})
    run_source(spark, conf, DEFS, "consumer_daily", DAY1)
    before = dump_stores(redis_db, pg_db)
    assert before[0] and before[1]
    with pytest.raises(QualityGateError) as info:
        run_source(spark, conf, DEFS, "consumer_daily", DAY2)
    message = str(info.value)
    assert "nothing was written" in message
    assert f"entity key unique after de-duplication: {conflicting:,} of" in message
    assert "favorite_cuisine null at most 30%" in message
    assert "taste_embedding has dimension 32" in message
    assert "consumer_id not null" not in message and "churn_score" not in message  # only what failed
    assert dump_stores(redis_db, pg_db) == before
    report = json.loads((Path(report_dir(conf, "consumer_daily", DAY2)) / "summary.json").read_text())
    assert report["status"] == "failed" and report["conflicting_keys"] == conflicting and "redis" not in report["sinks"]
    failed = {e["name"] for e in report["expectations"] if not e["success"]}
    assert failed == {"entity key unique after de-duplication", "favorite_cuisine null at most 30%", "taste_embedding has dimension 32"}
    page = next((Path(report_dir(conf, "consumer_daily", DAY2)) / "data_docs" / "validations").rglob("*.html"))
    assert "Unsuccessful Expectations 3" in page_text(page)


def test_row_count_collapse_against_the_previous_run_fails(spark, sample_root, gate_conf, redis_db, tmp_path):
    df = spark.read.format("delta").load(str(sample_root / "consumer_daily"))
    collapsed = df.where((F.col("ds") == DAY1) | (F.col("consumer_id") % 4 == 0))  # DAY2 keeps about a quarter
    collapsed.write.format("delta").save(str(tmp_path / "consumer_daily"))
    conf = gate_conf.model_copy(update={"data_root": str(tmp_path), "sinks": ["redis"]})
    day1 = run_source(spark, conf, DEFS, "consumer_daily", DAY1)
    with pytest.raises(QualityGateError, match=rf"entities within 50% of the {day1.snapshot_entities:,} on {DAY1}: observed \d+"):
        run_source(spark, conf, DEFS, "consumer_daily", DAY2)


def test_verification_catches_values_corrupted_between_write_and_check(spark, gate_conf, redis_db, pg_db):
    def corrupt(summary):
        redis_db.hset("c:7", field_id("orders_7d"), b"999999")
        pg_db.execute("""UPDATE consumer_features SET features = features || '{"churn_score": 7.5}' WHERE entity_key = '11'""")

    with pytest.raises(VerificationError) as info:
        run_source(spark, gate_conf, DEFS, "consumer_daily", DAY2, after_write=corrupt)
    assert "2 value(s) read back differ" in str(info.value)
    report = json.loads((Path(report_dir(gate_conf, "consumer_daily", DAY2)) / "summary.json").read_text())
    assert report["status"] == "failed"
    redis_found = report["verification"]["redis"]
    assert redis_found["mismatches"] == 1
    assert redis_found["listed"][0]["key"] == "c:7" and redis_found["listed"][0]["feature"] == "orders_7d"
    assert redis_found["listed"][0]["found"] == "999999"
    sql_found = report["verification"]["sql"]["listed"]
    assert [(m["key"], m["feature"], m["found"]) for m in sql_found] == [("11", "churn_score", "7.5")]


def test_validate_checks_without_writing(spark, gate_conf, redis_db, pg_db):
    summary = validate_source(spark, gate_conf, DEFS, "store_features_long", DAY2)
    assert summary.status == "passed" and summary.expectations and all(e["success"] for e in summary.expectations)
    assert summary.bad_reasons == {"key store_id contains ':'": 1, "null key store_id": 1}
    report = json.loads((Path(report_dir(gate_conf, "store_features_long", DAY2)) / "validation.json").read_text())
    assert report["status"] == "passed" and report["profile"]["open_hours_week"]["min"] >= 20
    assert redis_db.dbsize() == 0  # nothing written anywhere, not even the quarantine
    assert not Path(gate_conf.quarantine_path, "store_features_long").exists()
    assert (Path(report_dir(gate_conf, "store_features_long", DAY2)) / "validate_docs" / "index.html").is_file()
    assert not (Path(report_dir(gate_conf, "store_features_long", DAY2)) / "summary.json").exists()


def test_checks_are_derived_from_the_definitions():
    names = [c.name for c in derive_checks(CONSUMER, DEFS.entity_of(CONSUMER), QualityConf(), ("2026-11-19", 1000))]
    assert names[:2] == ["consumer_id not null", "entity key unique after de-duplication"]
    assert "taste_embedding has dimension 32" in names and "churn_score in [0.0, 1.0]" in names
    assert "avg_order_value_7d null at most 25%" in names and "favorite_cuisine null at most 30%" in names
    assert "entities within 50% of the 1,000 on 2026-11-19" in names
    assert sum(n.endswith(" is float") for n in names) == 20  # one type check per feature
    assert sum(n.startswith(f"{f.name} is ") for f in CONSUMER.features for n in names) == len(CONSUMER.features) == 28


def test_unknown_extra_expectation_is_a_definition_error_with_file_and_line(tmp_path, redis_server, redis_db, monkeypatch, capsys):
    (tmp_path / "a").mkdir()
    # a column the source does not have: found as the definitions load
    with pytest.raises(DefinitionError) as info:
        tiny_consumer_source(None, tmp_path / "a", "    - {name: score, type: float}\n", "", [],
            "  expectations:\n    - {type: expect_column_values_to_be_between, kwargs: {column: scor, min_value: 0}}\n")  # fmt: skip
    assert "tiny.yaml:9: source 'tiny': expectations[0] expect_column_values_to_be_between: column 'scor' is not a feature or key" in str(
        info.value
    )

    # what only great-expectations knows (its names, its arguments): found before anything runs expectations
    extra = (
        "  expectations:\n"
        "    - {type: expect_column_values_to_be_nice, kwargs: {column: score}}\n"
        "    - {type: expect_column_values_to_be_between, kwargs: {column: score, min_value: 0, mostly: 2}}\n"
    )
    folder = tmp_path / "b" / "defs"
    folder.mkdir(parents=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "tiny.yaml").write_text(TINY_SOURCE + "    - {name: score, type: float}\n" + extra)
    defs = load_definitions(folder)  # no table: nothing gets as far as reading it
    with pytest.raises(DefinitionError) as info:
        defs.check_expectations()
    text = str(info.value)
    assert "tiny.yaml:9: source 'tiny': expectations[0] expect_column_values_to_be_nice: not a great-expectations expectation" in text
    assert "tiny.yaml:10: source 'tiny': expectations[1] expect_column_values_to_be_between: invalid kwargs: " in text and "mostly" in text
    # the CLI: `defs`, `validate` and a run with the gate's expectations say so before Spark starts, and write nothing
    conf = env_conf(tmp_path / "conf", "ci",
        f"data_root: {tmp_path / 'b'}\ndefinitions_dir: {tmp_path / 'b' / 'defs'}\nledger_root: {tmp_path / 'ledger'}\n"
        f"reports_dir: {tmp_path / 'reports'}\nsinks: [redis]\nredis: {{url: '{redis_server.url}'}}\n"
    )  # fmt: skip
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    for command in (["defs"], ["run", "--date", str(DAY2)], ["validate", "--date", str(DAY2)]):
        assert main([*command, "--env", "ci"]) == 2, command
        assert (
            "tiny.yaml:9: source 'tiny': expectations[0] expect_column_values_to_be_nice: not a great-expectations"
            in capsys.readouterr().err
        )
    assert not (tmp_path / "ledger").exists() and not (tmp_path / "reports").exists() and redis_db.dbsize() == 0


TIERS = (
    "    - {name: tier, type: string, allowed_values: [gold, silver], severity: warning}\n"
    "    - {name: visits, type: int, min_value: 0, max_value: 10}\n"
)


def test_warning_checks_report_but_do_not_block(spark, run_conf, tmp_path):
    rows = [(1, "gold", 3, DAY2), (2, "bronze", 4, DAY2), (3, "silver", 5, DAY2)]
    schema = "consumer_id long, tier string, visits long, ds date"
    defs = tiny_consumer_source(spark, tmp_path, TIERS, schema, rows)
    conf = run_conf.model_copy(update={"data_root": str(tmp_path)})
    summary = validate_source(spark, conf, defs, "tiny", DAY2)
    assert summary.status == "passed"
    assert summary.warnings == ["expectation failed (warning): tier in allowed values: 1 of 3 unexpected (33.33%)"]
    # the same kind of check, blocking, stops it
    defs = tiny_consumer_source(spark, tmp_path, TIERS, schema, [*rows, (4, "gold", 11, DAY2)])
    with pytest.raises(QualityGateError, match=r"visits in \[0.0, 10.0\]: 1 of 4 unexpected"):
        validate_source(spark, conf, defs, "tiny", DAY2)


def test_nan_counts_as_null_and_float32_bounds_hold_at_the_edge(spark, run_conf, tmp_path):
    features = "    - {name: score, type: float}\n    - {name: share, type: float, precision: float32, min_value: 0.1, max_value: 0.95}\n"
    nan = float("nan")
    rows = [(1, nan, 0.1, DAY2), (2, nan, 0.95, DAY2), (3, 0.5, 0.5, DAY2), (4, float("inf"), nan, DAY2)]
    defs = tiny_consumer_source(spark, tmp_path, features, "consumer_id long, score double, share float, ds date", rows)
    conf = run_conf.model_copy(update={"data_root": str(tmp_path)})
    with pytest.raises(QualityGateError) as info:
        validate_source(spark, conf, defs, "tiny", DAY2)
    # NaN and inf are never written: 3 of 4 scores are missing; the bounds hold for float32 0.1 and 0.95
    assert "score null at most 25%: 3 of 4 unexpected (75.00%)" in str(info.value)
    assert "share" not in str(info.value)
    report = json.loads((Path(report_dir(conf, "tiny", DAY2)) / "validation.json").read_text())
    assert report["profile"]["score"] == {"null_fraction": 0.75, "zero_fraction": 0.0, "min": 0.5, "max": 0.5, "mean": 0.5}
