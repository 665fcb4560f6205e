"""A date far in the future (`run --date 2099-01-01`, a typo): refused by every command that
takes a date; a 2099 snapshot already in the stores is corrupt to the readers of both stores
and is replaced by the next correct run; a run most of whose entities a store left because it
holds a newer snapshot fails. Every expectation is derived here: the UTC calendar by hand,
the source rows from the sample generator (pandas), the stored bytes by the scalar encoder."""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from feature_defs import load_definitions
from feature_reader import FeatureReader
from fm_config import RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.cli import main
from jobs.pipeline.run import run_source
from jobs.sample_data import consumer_rows
from serializers import field_id, freshness_field
from serializers.keys import as_of_epoch

from .expected import entity_keys, expected_hash
from .support.confs import env_conf
from .support.samples import SAMPLE_CONSUMERS, SAMPLE_DATES

DEFS = load_definitions()
SOURCE = DEFS.sources["consumer_daily"]
DAY1, DAY2 = SAMPLE_DATES
FRESH = freshness_field("consumer_daily")
TYPO = dt.date(2099, 1, 1)
TYPO_AS_OF = int(dt.datetime(2099, 1, 2, tzinfo=dt.UTC).timestamp())  # the end of the typo's day
CREATE = (
    "CREATE TABLE IF NOT EXISTS consumer_features (entity_key TEXT NOT NULL, source TEXT NOT NULL, features JSONB NOT NULL, "
    "as_of TIMESTAMPTZ NOT NULL, PRIMARY KEY (entity_key, source))"
)  # serializers/FORMAT.md, "SQL layout"


def utc(*args) -> int:
    return int(dt.datetime(*args, tzinfo=dt.UTC).timestamp())


def good_rows(day: dt.date) -> pd.DataFrame:
    """The day's consumers as the run must write them: the latest row per consumer, bad rows out
    (a null key, and the ids above SAMPLE_CONSUMERS the generator gives its bad values)."""
    rows = consumer_rows(day, SAMPLE_CONSUMERS)
    rows = rows[rows["consumer_id"].notna() & (rows["consumer_id"] <= SAMPLE_CONSUMERS)]
    return rows.sort_values("updated_at").groupby("consumer_id").tail(1).set_index("consumer_id")


def put_redis(client, consumer: int, as_of: int, orders_7d: bytes = b"999") -> None:
    client.hset(f"c:{consumer}", mapping={FRESH: str(as_of).encode(), field_id("orders_7d"): orders_7d})


def put_sql(conn, consumer: int, as_of: int, features: str = '{"orders_7d": 999}') -> None:
    conn.execute(CREATE)
    conn.execute(
        "INSERT INTO consumer_features VALUES (%s, 'consumer_daily', %s::jsonb, to_timestamp(%s))", (str(consumer), features, as_of)
    )
    conn.commit()


def read_both(conf: RunConf, ids: list[int], now: float) -> dict:
    """Per store: (statuses, values, event timestamps) of orders_7d, and the bad_freshness count of the read."""
    out = {}
    with FeatureReader(conf, DEFS, cache=False, clock=lambda: now) as reader:
        for store in ("redis", "sql"):
            before = reader.stats["bad_freshness"]
            result = reader.get_online_features(["consumer_daily:orders_7d"], {"consumer_id": ids}, store=store).to_feast()
            column = result["results"][1]
            out[store] = (column["statuses"], column["values"], column["event_timestamps"], reader.stats["bad_freshness"] - before)
    return out


def test_the_rule_by_the_calendar():
    """One rule for dates and stored as-of times (serializers/horizon.py), against the UTC calendar."""
    from serializers.horizon import FutureDateError, as_of_horizon, check_date

    late = utc(2026, 11, 21, 23, 59, 59)  # the last second of the 21st
    check_date(dt.date(2026, 11, 22), now=late)  # tomorrow: accepted
    said = r"^--date 2026-11-23 is in the future: today is 2026-11-21 UTC and the latest date accepted is 2026-11-22 "
    with pytest.raises(FutureDateError, match=said):
        check_date(dt.date(2026, 11, 23), now=late)
    check_date(dt.date(2026, 11, 23), now=late + 1)  # a second later, the 22nd: accepted
    assert as_of_horizon(utc(2026, 11, 21, 12)) == 1795392000 == utc(2026, 11, 23)  # FORMAT.md's example
    assert as_of_horizon(utc(2026, 11, 21, 23, 54, 59)) == utc(2026, 11, 23)  # 300 s short of midnight
    assert as_of_horizon(utc(2026, 11, 21, 23, 55)) == utc(2026, 11, 24)  # a clock 300 s ahead is on the 22nd
    assert as_of_horizon(utc(2026, 11, 21, 23, 55), skew_seconds=0) == utc(2026, 11, 23)
    assert as_of_horizon(utc(1969, 12, 31, 6)) == utc(1970, 1, 2)  # before the epoch too


@pytest.fixture
def stores_conf(redis_server, pg_server, redis_db, pg_db, tmp_path) -> RunConf:
    return RunConf(
        env="test", sinks=["redis", "sql"], reports_dir=str(tmp_path / "reports"),
        redis=RedisSettings(url=redis_server.url, password_env=None, mode="standalone"),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None), reader=ReaderSettings(timeout_ms=10_000),
    )  # fmt: skip


@pytest.fixture
def cli_env(sample_root, redis_server, pg_server, redis_db, pg_db, tmp_path, monkeypatch) -> tuple[str, Path]:
    """A conf env of its own for in-process CLI calls: the sample tables into both stores (the session's Spark)."""
    folder = env_conf(
        tmp_path / "conf",
        "fut",
        f"data_root: {sample_root}\nledger_root: {tmp_path / 'ledger'}\nquarantine_root: {tmp_path / 'q'}\n"
        f"reports_dir: {tmp_path / 'reports'}\nsinks: [redis, sql]\n"
        f"redis:\n  url: {redis_server.url}\n  password_env: null\n  sample_entities: 20\n"
        f"sql:\n  dsn: {pg_server.dsn}\n  password_env: null\n"
        "quality:\n  max_bad_fraction: 0.05\n  expectations: false\n  verify_sample: 50\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    return "fut", tmp_path


def test_run_validate_verify_and_the_spark_submit_entry_refuse_a_date_past_tomorrow(redis_db, tmp_path, monkeypatch, capsys):
    folder = env_conf(tmp_path / "conf", "fut", f"ledger_root: {tmp_path / 'ledger'}\nreports_dir: {tmp_path / 'reports'}\n")
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    today = dt.datetime.now(dt.UTC).date()
    said = f"--date 2099-01-01 is in the future: today is {today} UTC and the latest date accepted is {today + dt.timedelta(days=1)}"
    for command in ("run", "validate", "verify"):
        assert main([command, "--env", "fut", "--date", "2099-01-01"]) == 2, command  # usage: exit code 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err  # one line, naming the date and today
    day_after = today + dt.timedelta(days=2)  # the first date refused
    assert main(["run", "--env", "fut", "--date", str(day_after), "--source", "consumer_daily"]) == 2
    assert f"--date {day_after} is in the future" in capsys.readouterr().err
    # what Airflow's materialize task runs (spark-submit of jobs/materialize.py): the same refusal
    done = subprocess.run(
        [sys.executable, "jobs/materialize.py", "--env", "fut", "--date", "2099-01-01"],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert redis_db.dbsize() == 0 and not (tmp_path / "ledger").exists() and not (tmp_path / "reports").exists()


def test_a_stored_as_of_past_the_horizon_is_invalid_in_both_stores_alike(stores_conf, redis_db, pg_db):
    # 23:56 UTC on 2026-11-21: the latest date a run accepts is 2026-11-22, whose as-of is
    # 2026-11-23 00:00; a writer's clock 300 s ahead is already on the 22nd: 2026-11-24 00:00
    now = utc(2026, 11, 21, 23, 56)
    stored = {
        1: utc(2026, 11, 21),  # today's snapshot: PRESENT
        2: utc(2026, 11, 23),  # tomorrow's: PRESENT
        3: utc(2026, 11, 24),  # past the horizon by this clock, within it by one 300 s ahead: PRESENT
        4: utc(2026, 11, 24) + 1,  # past both: corrupt
        5: TYPO_AS_OF,  # run --date 2099-01-01: corrupt
    }
    for consumer, as_of in stored.items():
        put_redis(redis_db, consumer, as_of, b"%d" % consumer)
        put_sql(pg_db, consumer, as_of, json.dumps({"orders_7d": consumer}))
    got = read_both(stores_conf, [*stored, 6], now)
    stamp = lambda t: dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
    want = (
        ["PRESENT", "PRESENT", "PRESENT", "INVALID", "INVALID", "NOT_FOUND"],
        [1, 2, 3, None, None, None],
        [stamp(stored[1]), stamp(stored[2]), stamp(stored[3]), stamp(0), stamp(0), stamp(0)],  # no time shown for the corrupt
        2,  # counted in bad_freshness, once per entity
    )
    assert got == {"redis": want, "sql": want}
    # the allowance for clocks is the reader's setting: none, and 3 is past the horizon too
    strict = stores_conf.model_copy(update={"reader": stores_conf.reader.model_copy(update={"clock_skew_seconds": 0})})
    assert read_both(strict, [3], now) == {store: (["INVALID"], [None], [stamp(0)], 1) for store in ("redis", "sql")}


def test_a_2099_snapshot_is_replaced_by_the_next_correct_run_in_both_stores(spark, sql_conf, redis_db, pg_db):
    conf = sql_conf.model_copy(update={"sinks": ["redis", "sql"]})
    day = good_rows(DAY2)
    typo, gone = [int(i) for i in day.index[:5]], SAMPLE_CONSUMERS + 7  # gone: in no later snapshot
    for consumer in [*typo, gone]:
        put_redis(redis_db, consumer, TYPO_AS_OF)
        put_sql(pg_db, consumer, TYPO_AS_OF)

    summary = run_source(spark, conf, DEFS, "consumer_daily", DAY2)
    assert summary.status == "succeeded", summary.error
    # Redis: exactly what the run writes for those entities (the scalar encoder over the source rows)
    as_of = as_of_epoch(DAY2)
    for consumer in typo:
        assert redis_db.hgetall(f"c:{consumer}") == expected_hash(SOURCE.features, day.loc[consumer], FRESH, as_of)
    # both stores read back the new value, dated DAY2, for the replaced; the one no run wrote stays corrupt
    got = read_both(conf, [*typo, gone], as_of + 3600)
    want = (
        ["PRESENT"] * len(typo) + ["INVALID"],
        [int(day.loc[c, "orders_7d"]) for c in typo] + [None],
        ["2026-11-21T00:00:00Z"] * len(typo) + ["1970-01-01T00:00:00Z"],
        1,
    )
    assert got == {"redis": want, "sql": want}
    # counted apart from the entities written over older snapshots, and said
    redis, sql = summary.sinks["redis"], summary.sinks["sql"]
    assert (redis["replaced_future"], redis["skipped_newer"], sql["rows_replaced_future"], sql["rows_skipped_newer"]) == (5, 0, 5, 0)
    said = "\n".join(summary.warnings)
    assert f"redis: {len(typo)} entities held an as-of time of consumer_daily later than any date a run accepts" in said
    assert f"postgres: {len(typo)} rows held an as-of time of consumer_daily later than any date a run accepts" in said


def test_a_run_most_of_whose_entities_hold_a_newer_snapshot_fails(cli_env, redis_db, pg_db, capsys):
    # DAY2's snapshot already in both stores for every consumer of DAY1 (e.g. written a day early):
    # DAY1's run then changes nothing
    consumers = [int(i) for i in good_rows(DAY1).index]
    for consumer in consumers:
        put_redis(redis_db, consumer, as_of_epoch(DAY2))
        put_sql(pg_db, consumer, as_of_epoch(DAY2))
    redis_before = {k: redis_db.hgetall(k) for k in entity_keys(redis_db)}
    sql_before = pg_db.execute("SELECT entity_key, features::text, as_of FROM consumer_features ORDER BY 1").fetchall()

    assert main(["run", "--env", cli_env[0], "--date", str(DAY1), "--source", "consumer_daily"]) == 7  # a retry changes nothing either
    err = capsys.readouterr().err
    n = len(consumers)
    assert (
        f"MostlySkippedNewer: redis: {n:,} of {n:,} entities (100%); sql: {n:,} of {n:,} rows (100%) already hold a "
        f"newer snapshot of consumer_daily than {DAY1} and were left as they are, more than quality.max_skipped_newer (50%)"
    ) in err
    assert "materialize backfill --source consumer_daily --mode replay" in err and "materialize runs --source consumer_daily" in err
    assert {k: redis_db.hgetall(k) for k in entity_keys(redis_db)} == redis_before  # (what the stores hold is described now)
    assert pg_db.execute("SELECT entity_key, features::text, as_of FROM consumer_features ORDER BY 1").fetchall() == sql_before
    summary = json.loads((cli_env[1] / "reports" / "consumer_daily" / str(DAY1) / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("MostlySkippedNewer: ")  # recorded as failed
