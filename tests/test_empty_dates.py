"""A date without rows is not ready: not a success of 0 entities that would block every later date.

Through the CLI (in process, on the session's Spark), against the suite's Redis: `run` and
`validate` of an empty date exit 3 naming source, date and table, and record nothing; the
next date's row-count band compares with the last date that had rows, also when the ledger
and reports hold a 0-entity success from before; a backfill over an empty date lists it as
not ready and writes the others; `ready` and `run` agree on a long source whose date holds
only rows of other features' names.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from jobs.cli import main
from jobs.operations.ledger.events import Entry, Ledger
from jobs.pipeline.gate.checks import previous_success
from jobs.pipeline.report.summary import RunSummary
from serializers import as_of_epoch, decode, field_id

from .expected import entity_keys
from .support.confs import env_conf
from .support.samples import tiny_consumer_source, tiny_long_consumer_source

D1, D2, D3 = (dt.date(2026, 11, 17) + dt.timedelta(days=n) for n in range(3))
FEATURES = "    - {name: score, type: float}\n    - {name: orders, type: int}\n"
SCHEMA = "consumer_id long, score double, orders long, ds date"
CONSUMERS = {D1: range(1, 11), D3: range(2, 12)}  # D2: no rows at all


def score(cid: int, day: dt.date) -> float:
    return cid + day.day / 100


@pytest.fixture
def cli(spark, redis_server, tmp_path, monkeypatch) -> Path:
    """Source 'tiny' (rows on D1 and D3) and a conf for in-process CLI calls: the gate with its
    row-count band (quality.row_count_band 0.5, the default), the suite's Redis."""
    rows = [(cid, score(cid, day), cid * 2, day) for day, ids in CONSUMERS.items() for cid in ids]
    tiny_consumer_source(spark, tmp_path, FEATURES, SCHEMA, rows)
    folder = env_conf(
        tmp_path / "conf",
        "ci",
        f"data_root: {tmp_path}\ndefinitions_dir: {tmp_path / 'defs'}\nledger_root: {tmp_path / 'ledger'}\n"
        f"quarantine_root: {tmp_path / 'q'}\nreports_dir: {tmp_path / 'reports'}\n"
        f"sinks: [redis]\nredis:\n  url: {redis_server.url}\n  sample_entities: 20\n"
        "quality:\n  data_docs: false\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    return tmp_path


def cli_run(*args: str) -> int:
    return main([*args, "--env", "ci"])


def ledger_dates(spark, root: Path) -> list[tuple[str, dt.date, str]]:
    return sorted((r["kind"], r["start_date"], r["status"]) for r in Ledger(spark, root / "ledger").list("tiny", last=50))


def band_of(root: Path, day: dt.date) -> str:
    report = json.loads((root / "reports" / "tiny" / str(day) / "summary.json").read_text())
    assert report["status"] == "succeeded"
    [band] = [e for e in report["expectations"] if e["expectation"] == "expect_table_row_count_to_be_between"]
    assert band["success"]
    return band["name"]


def recorded_empty_success(spark, root: Path, day: dt.date, redis_url: str) -> None:
    """What a run of an empty date left before such a date was not ready: a succeeded step of 0
    entities in the ledger and a succeeded report of 0 entities (the row-count band's anchor)."""
    summary = RunSummary(source="tiny", entity="consumer", date=str(day), env="ci", as_of=as_of_epoch(day), status="succeeded")
    folder = root / "reports" / "tiny" / str(day)
    folder.mkdir(parents=True)
    summary.write_json(folder / "summary.json")
    ledger = Ledger(spark, root / "ledger")
    entry = Entry(kind="run", source="tiny", entity="consumer", start_date=day, end_date=day, sinks=["redis"], definitions_hash="d",
                  config_hash="c", features=["score", "orders"], targets={"redis": redis_url})  # fmt: skip
    ledger.start(entry)
    ledger.finish(entry, summary)


@pytest.mark.slow
def test_an_empty_date_is_not_ready_and_blocks_no_later_date(spark, cli, redis_server, redis_db, capsys):
    for command in ("validate", "run"):
        assert cli_run(command, "--date", str(D2)) == 3, command
        err = capsys.readouterr().err
        assert f"not ready: tiny: source 'tiny' has no rows for {D2} (ds) in {cli / 'tiny'}" in err, (command, err)
        assert "nothing was written or recorded" in err
    assert ledger_dates(spark, cli) == [] and redis_db.dbsize() == 0
    assert not (cli / "reports" / "tiny" / str(D2)).exists()  # no report, so no anchor of 0 either

    # A ledger and reports that hold a 0-entity success of D2 from before anchor nothing either.
    # Replay: each date a run with the row-count band, which for D3 looks past D2 to D1.
    recorded_empty_success(spark, cli, D2, redis_server.url)
    assert cli_run("backfill", "--source", "tiny", "--start", str(D1), "--end", str(D3), "--mode", "replay") == 0
    out = capsys.readouterr().out
    assert f"  to write:         {D1}, {D3}" in out and f"  no rows:          {D2} (not ready: skipped" in out
    assert f"not ready (no rows), skipped: {D2}; the other dates are written" in out
    assert band_of(cli, D3) == f"entities within 50% of the 10 on {D1}"
    assert ledger_dates(spark, cli) == sorted(
        [("backfill-replay", D1, "succeeded"), ("run", D2, "succeeded"), ("backfill-replay", D3, "succeeded")]
    )
    latest = {cid: D3 if cid in CONSUMERS[D3] else D1 for cid in (*CONSUMERS[D1], *CONSUMERS[D3])}
    assert sorted(entity_keys(redis_db)) == sorted(f"c:{cid}".encode() for cid in latest)
    assert {c: int(redis_db.hget(f"c:{c}", field_id("_ts:tiny"))) for c in latest} == {c: as_of_epoch(d) for c, d in latest.items()}
    assert {c: decode("float", redis_db.hget(f"c:{c}", field_id("score"))) for c in latest} == {c: score(c, d) for c, d in latest.items()}

    # a range without any rows: not ready, nothing written or recorded
    assert cli_run("backfill", "--source", "tiny", "--start", str(D2), "--end", str(D2)) == 3
    assert f"not ready: source tiny has no rows dated {D2}..{D2}: nothing to write" in capsys.readouterr().err
    assert len(ledger_dates(spark, cli)) == 3


def test_the_row_count_band_looks_past_a_0_entity_success(tmp_path):
    for day, entities in ((D1, 10), (D2, 0), (D3, 9)):
        (tmp_path / "src" / str(day)).mkdir(parents=True)
        (tmp_path / "src" / str(day) / "summary.json").write_text(json.dumps({"status": "succeeded", "snapshot_entities": entities}))
    assert previous_success(tmp_path, "src", D3) == (str(D1), 10)
    assert previous_success(tmp_path, "src", D3 + dt.timedelta(days=1)) == (str(D3), 9)


def test_ready_and_run_agree_on_a_long_date_holding_only_other_names(spark, redis_server, redis_db, tmp_path, monkeypatch, capsys):
    # a table shared with other sources: on D2 it holds rows of names this source does not define
    rows = [(1, "visits", 3.0, D1), (2, "visits", 4.0, D1), (1, "other_source_feature", 1.0, D2)]
    tiny_long_consumer_source(spark, tmp_path, "    - {name: visits, type: float}\n", "double", rows)
    folder = env_conf(
        tmp_path / "conf",
        "ci",
        f"data_root: {tmp_path}\ndefinitions_dir: {tmp_path / 'defs'}\nledger_root: {tmp_path / 'ledger'}\n"
        f"quarantine_root: {tmp_path / 'q'}\nreports_dir: {tmp_path / 'reports'}\nsinks: [redis]\n"
        f"redis:\n  url: {redis_server.url}\n  sample_entities: 20\nquality:\n  expectations: false\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    assert cli_run("ready", "--source", "tiny_long", "--date", str(D1)) == 0
    assert cli_run("ready", "--source", "tiny_long", "--date", str(D2)) == 3
    assert cli_run("run", "--date", str(D2)) == 3
    err = capsys.readouterr().err
    assert f"source 'tiny_long' has no rows of its 1 feature names (feature_name) for {D2} (ds)" in err
    assert redis_db.dbsize() == 0 and Ledger(spark, tmp_path / "ledger").list("tiny_long") == []
