"""Backfills, the run ledger and stale-field cleanup, on five sample dates and real servers."""

from __future__ import annotations

import datetime as dt

import pytest
import redis

from feature_defs import load_definitions
from jobs.cli import main
from jobs.operations.backfill import BackfillError, plan_backfill, recorded_run, run_backfill
from jobs.operations.cleanup.redis import clean, plan_cleanup
from jobs.operations.ledger.events import Entry, Ledger
from jobs.sample_data import sample_dates, write_sample_tables
from serializers import field_id
from throwaway.servers import start_redis

from .expected import entity_count
from .support.confs import env_conf

DEFS = load_definitions()
FIVE = sample_dates(5)  # 2026-11-16 .. 2026-11-20


@pytest.fixture(scope="module")
def five_days(spark, tmp_path_factory):
    root = tmp_path_factory.mktemp("five_days")
    write_sample_tables(spark, root, FIVE, consumers=150, stores=40)
    return root


@pytest.fixture
def conf(run_conf, five_days, tmp_path):
    return run_conf.model_copy(
        update={"data_root": str(five_days), "ledger_root": str(tmp_path / "ledger"), "quarantine_root": str(tmp_path / "q")}
    )


def state(client: redis.Redis) -> dict:
    """Every hash, raw, and whether it has a TTL."""
    return {k: (client.hgetall(k), client.ttl(k) > 0) for k in client.scan_iter()}


# the wide source's latest == replay is checked by test_interrupted_backfill_resumes_and_completes
@pytest.mark.parametrize("source", ["store_features_long"])
def test_latest_mode_leaves_the_state_of_replaying_the_dates_in_order(spark, conf, redis_server, redis_db, tmp_path, source):
    latest_db, replay_db = redis_server.client(0), redis_server.client(1)
    replay_db.flushdb()
    ledger = Ledger(spark, tmp_path / "ledger")
    dates = FIVE[:3]  # three dates: earlier rows superseded, entities coming and going, and a short suite
    plan = plan_backfill(spark, conf, DEFS, ledger, source, dates[0], dates[-1], "latest", force=False)
    assert plan.steps == [(dates[0], dates[-1])] and plan.to_write == dates
    [summary] = run_backfill(spark, conf, DEFS, ledger, plan)
    # one write per entity, not one per day
    assert summary.sinks["redis"]["entities"] == summary.entities == entity_count(latest_db)
    assert summary.earlier_dates > 0

    replay_conf = conf.model_copy(update={"ledger_root": str(tmp_path / "ledger2")})
    replay_plan = plan_backfill(
        spark, replay_conf, DEFS, Ledger(spark, tmp_path / "ledger2"), source, dates[0], dates[-1], "replay", force=False
    )
    assert replay_plan.steps == [(d, None) for d in dates]
    run_backfill(spark, replay_conf, DEFS, Ledger(spark, tmp_path / "ledger2"), replay_plan, redis_url=redis_server.url[:-1] + "1")
    assert state(latest_db) == state(replay_db)
    assert len(state(latest_db)) > 30


def test_interrupted_backfill_resumes_and_completes(spark, conf, tmp_path):
    server = start_redis(tmp_path / "redis", "--maxmemory", "256mb")
    try:
        conf = conf.model_copy(update={"redis": conf.redis.model_copy(update={"url": server.url, "retries": 0})})
        ledger = Ledger(spark, tmp_path / "ledger")
        calls = []

        def stop_redis_after_second_date(summary):
            calls.append(summary.date)
            if len(calls) == 2:
                server.client().shutdown(save=True)  # the store goes away mid-backfill, keeping what it has

        last = FIVE[1]  # two dates keep it short: the store goes away after the second's write
        plan = plan_backfill(spark, conf, DEFS, ledger, "consumer_daily", FIVE[0], last, "replay", force=False)
        with pytest.raises(BackfillError, match=f"stopped at {FIVE[1]}"):
            run_backfill(spark, conf, DEFS, ledger, plan, after_write=stop_redis_after_second_date)
        assert set(ledger.written_dates("consumer_daily", {"redis": server.url})) == {FIVE[0]}
        server = start_redis(tmp_path / "redis", "--maxmemory", "256mb", port=server.port)  # back, with its data

        resumed = plan_backfill(spark, conf, DEFS, ledger, "consumer_daily", FIVE[0], last, "replay", force=False)
        assert resumed.already_written == [FIVE[0]] and resumed.to_write == [FIVE[1]]
        run_backfill(spark, conf, DEFS, ledger, resumed)
        assert set(ledger.written_dates("consumer_daily", {"redis": server.url})) == set(FIVE[:2])
        statuses = sorted((r["start_date"], r["status"]) for r in ledger.list("consumer_daily", last=50))
        assert statuses == sorted([(FIVE[0], "succeeded"), (FIVE[1], "failed"), (FIVE[1], "succeeded")])

        # the result is the state of an uninterrupted pass (latest mode into db 1 as reference)
        reference = conf.model_copy(update={"ledger_root": str(tmp_path / "ref-ledger")})
        ref_ledger = Ledger(spark, tmp_path / "ref-ledger")
        ref_plan = plan_backfill(spark, reference, DEFS, ref_ledger, "consumer_daily", FIVE[0], last, "latest", force=False)
        run_backfill(spark, reference, DEFS, ref_ledger, ref_plan, redis_url=server.url[:-1] + "1")
        assert state(server.client(0)) == state(server.client(1))
    finally:
        server.stop()


@pytest.fixture
def cli_conf(five_days, redis_server, tmp_path, monkeypatch):
    """A conf folder for in-process CLI calls (the session's Spark is reused)."""
    folder = env_conf(
        tmp_path / "conf",
        "ci",
        f"data_root: {five_days}\nledger_root: {tmp_path / 'ledger'}\n"
        f"quarantine_root: {tmp_path / 'q'}\nreports_dir: {tmp_path / 'reports'}\n"
        f"sinks: [redis]\nredis:\n  url: {redis_server.url}\n  sample_entities: 20\n"
        "quality:\n  max_bad_fraction: 0.05\n  expectations: false\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    return tmp_path


def test_dry_run_writes_nothing_and_a_rerun_without_force_says_so(spark, cli_conf, redis_db, capsys):
    args = ["backfill", "--env", "ci", "--source", "store_features_long", "--start", str(FIVE[0]), "--end", str(FIVE[-1])]
    assert main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "to write:         " + ", ".join(str(d) for d in FIVE) in out and "dry run: nothing written" in out
    assert "estimated:" in out and " rows read, about " in out
    assert redis_db.dbsize() == 0 and not (cli_conf / "ledger").exists()

    assert main(args) == 0
    written = {k: redis_db.dump(k) for k in redis_db.scan_iter()}
    assert written
    capsys.readouterr()
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "nothing to write: every date with data in" in out and "already written:  " + ", ".join(str(d) for d in FIVE) in out
    assert {k: redis_db.dump(k) for k in redis_db.scan_iter()} == written

    assert main(["runs", "--env", "ci"]) == 0
    listing = capsys.readouterr().out
    assert "backfill-latest" in listing and f"{FIVE[0]}..{FIVE[-1]}" in listing and "succeeded" in listing


def test_future_end_date_is_refused(spark, cli_conf, capsys):
    # the rule of run and validate too (serializers/horizon.py): tomorrow, UTC, is the latest date accepted
    later = dt.datetime.now(dt.UTC).date() + dt.timedelta(days=2)
    assert main(["backfill", "--env", "ci", "--source", "consumer_daily", "--start", str(FIVE[0]), "--end", str(later)]) == 2
    assert f"--end {later} is in the future" in capsys.readouterr().err


def test_ledger_keeps_the_latest_state_and_shows_a_crashed_run(spark, tmp_path):
    ledger = Ledger(spark, tmp_path / "ledger")
    entry = Entry(
        kind="run",
        source="s",
        entity="e",
        start_date=FIVE[0],
        end_date=FIVE[0],
        sinks=["redis"],
        definitions_hash="d",
        config_hash="c",
        features=["a"],
        targets={"redis": "redis://h:1/0"},
        dates=[FIVE[0]],
    )
    ledger.start(entry)
    ledger.record(entry)  # a repeated append of one event changes nothing
    assert [r["status"] for r in ledger.list("s")] == ["running"]
    assert [r["run_id"] for r in ledger.running("s")] == [entry.run_id]  # e.g. the process died here
    ledger.finish(entry)
    assert [r["status"] for r in ledger.list("s")] == ["succeeded"] and ledger.running("s") == []
    assert ledger.written_dates("s", {"redis": "redis://h:1/0"}) == {FIVE[0]: {"a"}}
    assert ledger.written_dates("s", {"redis": "redis://h:1/1"}) == {}  # another database: not written there
    assert ledger.written_dates("s", {"redis": "redis://h:1/0", "sql": "postgresql://x"}) == {}
    row = ledger.list("s")[0]
    assert row["code_version"] and row["definitions_hash"] == "d" and row["ended_at"] >= row["started_at"]


def test_cleanup_removes_exactly_the_dropped_features_fields(spark, conf, redis_db, tmp_path):
    ledger = Ledger(spark, tmp_path / "ledger")
    recorded_run(spark, conf, DEFS, ledger, "run", "consumer_daily", FIVE[-1])
    recorded_run(spark, conf, DEFS, ledger, "run", "store_features_long", FIVE[-1])
    folder = tmp_path / "defs"
    folder.mkdir()
    for path in DEFS.files.values():
        (folder / path.name).write_text(path.read_text())
    text = (folder / "consumer_daily.yaml").read_text()
    assert "    - {name: tip_rate_30d, type: float}\n" in text
    (folder / "consumer_daily.yaml").write_text(text.replace("    - {name: tip_rate_30d, type: float}\n", ""))
    reduced = load_definitions(folder)

    before = {k: redis_db.hgetall(k) for k in redis_db.scan_iter()}
    had_field = [k for k, h in before.items() if field_id("tip_rate_30d") in h]
    assert len(had_field) > 50

    plan, keys = plan_cleanup(spark, conf, reduced, ledger, "consumer")
    assert plan.removed_features == ["tip_rate_30d"] and plan.removed_sources == []
    # keys to visit: every consumer id in the table on the date the ledger says was written, not a SCAN of Redis
    ids = (
        spark.read.format("delta")
        .load(str(conf.data_path / "consumer_daily"))
        .where(f"ds = '{FIVE[-1]}'")
        .select("consumer_id")
        .toPandas()["consumer_id"]
    )
    assert plan.keys == ids.dropna().nunique() > sum(k.startswith(b"c:") for k in before)
    result = clean(conf, reduced.entities["consumer"], plan, keys)
    keys["consumer_daily"].unpersist()
    assert result.cleaned["consumer_daily"]["fields_removed"] == len(had_field) and result.keys == plan.keys and not result.left

    after = {k: redis_db.hgetall(k) for k in redis_db.scan_iter()}
    expected = {k: {f: v for f, v in h.items() if not (k.startswith(b"c:") and f == field_id("tip_rate_30d"))} for k, h in before.items()}
    assert after == expected  # that field, on consumer keys only; nothing else
    # with current definitions nothing is stale
    assert plan_cleanup(spark, conf, DEFS, ledger, "consumer")[0].fields == []


def test_a_backfill_before_written_dates_applies_them_again_in_order(spark, conf, redis_server, tmp_path):
    ledger = Ledger(spark, tmp_path / "ledger")
    for day in FIVE[3:]:
        recorded_run(spark, conf, DEFS, ledger, "run", "store_features_long", day)
    replay = plan_backfill(spark, conf, DEFS, ledger, "store_features_long", FIVE[2], FIVE[2], "replay", force=False)
    assert replay.to_write == [FIVE[2]] and replay.reapply == FIVE[3:]
    assert replay.steps == [(d, None) for d in FIVE[2:]]  # the missed night, then the later ones again
    latest = plan_backfill(spark, conf, DEFS, ledger, "store_features_long", FIVE[0], FIVE[2], "latest", force=False)
    assert latest.to_write == FIVE[:3] and latest.steps == [(FIVE[0], FIVE[4])]  # no entity ends older than it was
    elsewhere = plan_backfill(
        spark, conf, DEFS, ledger, "store_features_long", FIVE[0], FIVE[4], "latest", False, redis_server.url[:-1] + "3"
    )
    assert elsewhere.to_write == FIVE and elsewhere.already_written == []  # written to db 0, not to db 3


def test_previous_run_for_the_row_count_band_is_a_single_date(tmp_path):
    import json

    from jobs.pipeline.gate.checks import previous_success

    for folder, entities in (("2026-11-18", 100), ("2026-11-16_2026-11-20", 500), ("2026-11-21", 90)):
        (tmp_path / "src" / folder).mkdir(parents=True)
        (tmp_path / "src" / folder / "summary.json").write_text(json.dumps({"status": "succeeded", "snapshot_entities": entities}))
    assert previous_success(tmp_path, "src", dt.date(2026, 11, 21)) == ("2026-11-18", 100)


def test_ready_says_whether_a_date_has_rows(spark, cli_conf, capsys):
    base = ["ready", "--env", "ci", "--source", "store_features_long", "--date"]
    assert main([*base, str(FIVE[0])]) == 0
    assert main([*base, "2026-10-01"]) == 3
    assert "has no rows for 2026-10-01 yet" in capsys.readouterr().out
