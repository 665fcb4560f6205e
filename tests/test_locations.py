"""Locations as URIs end to end: tables, quarantine, ledger and reports at ``file://`` URIs
(Spark's Hadoop filesystem and the driver's pyarrow filesystem, the code paths object storage
takes), the joins that keep a URI's ``//``, and sink targets matched by meaning, not text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from feature_defs import load_definitions
from fm_config import RunConf
from fm_config.locations import Location, resolve
from jobs.cli import main
from jobs.operations.backfill import recorded_run
from jobs.operations.ledger.events import Ledger, canonical_target
from jobs.pipeline.gate.checks import previous_success
from jobs.pipeline.read import source_path

from .expected import entity_count
from .support.confs import env_conf
from .support.samples import SAMPLE_DATES

DEFS = load_definitions()


@pytest.mark.parametrize(
    "root, expected",
    [
        ("s3a://lake/etl", ("s3a://lake/etl", "s3a://lake/etl/_quarantine", "s3a://lake/etl/_ledger", "s3a://lake/etl/consumer_daily")),
        ("abfss://etl@acct.dfs.core.windows.net/", ("abfss://etl@acct.dfs.core.windows.net/", "abfss://etl@acct.dfs.core.windows.net/_quarantine",
                                                    "abfss://etl@acct.dfs.core.windows.net/_ledger", "abfss://etl@acct.dfs.core.windows.net/consumer_daily")),
        ("gs://b/x/", ("gs://b/x/", "gs://b/x/_quarantine", "gs://b/x/_ledger", "gs://b/x/consumer_daily")),
        ("hdfs://nn:8020/etl", ("hdfs://nn:8020/etl", "hdfs://nn:8020/etl/_quarantine", "hdfs://nn:8020/etl/_ledger", "hdfs://nn:8020/etl/consumer_daily")),
        ("file:///srv/etl", ("file:///srv/etl", "file:///srv/etl/_quarantine", "file:///srv/etl/_ledger", "file:///srv/etl/consumer_daily")),
        ("/srv/etl", ("/srv/etl", "/srv/etl/_quarantine", "/srv/etl/_ledger", "/srv/etl/consumer_daily")),
    ],
)  # fmt: skip
def test_a_data_root_uri_stays_intact_in_every_location_derived_from_it(root, expected):
    conf = RunConf(data_root=root, reports_dir="s3a://lake/reports")
    got = (conf.data_path, conf.quarantine_path, conf.ledger_path, source_path(conf, DEFS.source("consumer_daily")))
    assert tuple(map(str, got)) == expected
    assert (
        conf.reports_path / "consumer_daily" / "2026-11-20" / "summary.json" == "s3a://lake/reports/consumer_daily/2026-11-20/summary.json"
    )


def test_local_conveniences_apply_to_local_paths_only(tmp_path):
    assert resolve("data", tmp_path) == str(tmp_path / "data")  # relative: under the root
    assert resolve("s3a://lake/data", tmp_path) == "s3a://lake/data"
    assert not Location("s3a://lake/data").is_local and Location("/data").is_local
    assert Location("s3a://lake/data/x").parent == "s3a://lake/data" and Location("s3a://lake/data/x").name == "x"
    assert Location("file:///srv/x").local_path() == Path("/srv/x")
    with pytest.raises(ValueError, match="not on this machine"):
        Location("s3a://lake/x").local_path()


@pytest.mark.parametrize(
    "sink, a, b",
    [
        ("redis", "redis://127.0.0.1:6379", "redis://127.0.0.1:6379/0"),
        ("redis", "redis://user:pw@Cache.Example.com/0?socket_timeout=3", "redis://cache.example.com:6379/0"),
        ("redis", "redis://h:6379/0#ns", "redis://h/0#ns"),
        ("sql", "postgresql://root@db:26257/features?sslmode=disable", "host=db port=26257 dbname=features user=root"),
        ("sql", "postgresql://root@db/features#s", "postgresql://root@DB:5432/features?application_name=x#s"),
    ],
)  # fmt: skip
def test_one_store_spelled_two_ways_is_one_target(sink, a, b):
    assert canonical_target(sink, a) == canonical_target(sink, b)


@pytest.mark.parametrize(
    "sink, a, b",
    [
        ("redis", "redis://h:6379/0", "redis://h:6379/1"),  # another database
        ("redis", "redis://h:6379/0", "rediss://h:6379/0"),
        ("redis", "redis://h:6379/0#a", "redis://h:6379/0#b"),  # another namespace
        ("sql", "postgresql://root@db:26257/features", "postgresql://root@db:26257/other"),
    ],
)  # fmt: skip
def test_other_stores_stay_other_targets(sink, a, b):
    assert canonical_target(sink, a) != canonical_target(sink, b)


def test_a_fresh_ledger_at_a_uri_reads_as_empty(spark, tmp_path):
    ledger = Ledger(spark, f"file://{tmp_path}/never-written")
    assert not ledger.exists()
    assert ledger.steps().count() == 0
    assert ledger.written_dates("consumer_daily", {"redis": "redis://h:6379/0"}) == {}
    assert not (tmp_path / "never-written").exists()  # reading made nothing


def test_a_run_with_every_location_a_uri_reads_writes_and_reports_there(spark, run_conf, redis_db, tmp_path, monkeypatch, capsys):
    """Tables read, quarantine and ledger written, summaries and data docs written and read
    back (the gate's row-count band, `materialize report`), all at file:// URIs."""
    uri = lambda p: f"file://{p}"  # noqa: E731
    locations = {
        "data_root": uri(Path(run_conf.data_root)), "quarantine_root": uri(tmp_path / "q"),
        "ledger_root": uri(tmp_path / "ledger"), "reports_dir": uri(tmp_path / "reports"),
    }  # fmt: skip
    quality = run_conf.quality.model_copy(update={"expectations": True, "data_docs": True, "row_count_band": 0.5})
    conf = run_conf.model_copy(update={**locations, "quality": quality})
    ledger = Ledger.of(spark, conf)
    assert ledger.path == uri(tmp_path / "ledger")
    ledger.create()
    summaries = [recorded_run(spark, conf, DEFS, ledger, "run", "consumer_daily", SAMPLE_DATES[0])]
    assert entity_count(redis_db) == summaries[0].sinks["redis"]["entities"] > 0  # the table at the URI was read and written
    summaries.append(recorded_run(spark, conf, DEFS, ledger, "run", "consumer_daily", SAMPLE_DATES[1]))
    assert [s.status for s in summaries] == ["succeeded", "succeeded"]

    # everything landed where the URIs say, read here with the standard library alone
    for day, summary in zip(SAMPLE_DATES, summaries):
        folder = tmp_path / "reports" / "consumer_daily" / day.isoformat()
        written = json.loads((folder / "summary.json").read_text())
        assert written["status"] == "succeeded" and written["snapshot_entities"] == summary.snapshot_entities
        assert (folder / "data_docs" / "index.html").is_file()
        assert summary.data_docs == uri(folder / "data_docs" / "index.html")
    assert (tmp_path / "q" / "consumer_daily" / "_delta_log").is_dir()
    assert (tmp_path / "ledger" / "_delta_log").is_dir()
    assert set(ledger.written_dates("consumer_daily", {"redis": run_conf.redis.url})) == set(SAMPLE_DATES)

    # the second date's gate found the first one's report for its row-count band
    first = SAMPLE_DATES[0].isoformat()
    assert previous_success(conf.reports_path, "consumer_daily", SAMPLE_DATES[1], conf.files) == (first, summaries[0].snapshot_entities)
    [band] = [e for e in summaries[1].expectations if e["expectation"] == "expect_table_row_count_to_be_between"]
    assert band["success"] is True and f"of the {summaries[0].snapshot_entities:,} on {first}" in band["name"]
    assert not [e for e in summaries[0].expectations if e["expectation"] == "expect_table_row_count_to_be_between"]  # no earlier run

    # the CLI reads the report back from the URI, and says where it is
    folder = env_conf(
        tmp_path / "conf", "uris", json.dumps({**locations, "sinks": ["redis"], "redis": {"url": run_conf.redis.url, "password_env": None}})
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    assert main(["report", "--env", "uris", "--date", SAMPLE_DATES[1].isoformat(), "--source", "consumer_daily"]) == 0
    out = capsys.readouterr().out
    assert f"report: {uri(tmp_path / 'reports' / 'consumer_daily' / SAMPLE_DATES[1].isoformat() / 'summary.json')}" in out
