"""A store emptied between nights (FLUSHALL, TRUNCATE, a restart without persistence) is
named by the next run, by backfill plans and by doctor, with the backfill that restores it;
a restart that kept the data is not. Real servers throughout."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from feature_defs import load_definitions
from fm_config import RunConf
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.cli import main
from jobs.exit_codes import EXIT_OK, EXIT_STORE_LOST
from jobs.operations.doctor.run import run_checks
from jobs.operations.doctor.stores import check_stored_data
from jobs.operations.ledger.events import Ledger, sink_targets
from jobs.operations.ledger.files import read_steps
from jobs.operations.ledger.store_state import compare
from serializers.keys import freshness_field
from sinks.redis import identity
from sinks.redis.config import redis_sink_config
from throwaway.servers import start_redis

from .support.confs import env_conf
from .support.samples import SAMPLE_DATES, tiny_consumer_source

DEFS = load_definitions()
DAY1, DAY2 = SAMPLE_DATES
SOURCE = "consumer_daily"


TINY = "tiny"
"""A consumer source of two features: a run of it costs a fraction of consumer_daily's."""
TINY_ROWS = [(i, DAY1, i / 3, f"d1-{i}") for i in range(1, 41)] + [(i, DAY2, i / 7, f"d2-{i}") for i in range(21, 61)]


def redis_state(client) -> dict:
    """Every consumer hash, raw, and whether it has a TTL."""
    return {k: (client.hgetall(k), client.ttl(k) > 0) for k in client.scan_iter(match="c:*")}


def sql_state(conn) -> dict:
    rows = conn.execute("SELECT entity_key, features::text, as_of FROM consumer_features WHERE source = %s", (TINY,))
    return {k: (doc, as_of) for k, doc, as_of in rows}


@pytest.fixture
def tiny(spark, redis_server, pg_server, pg_db, tmp_path, monkeypatch):
    """The source 'tiny' and a conf folder writing it to both stores (in-process CLI calls
    reuse the session's Spark). Returns the conf and the definitions."""
    features = "    - {name: tiny_score, type: float}\n    - {name: tiny_label, type: string}\n"
    defs = tiny_consumer_source(spark, tmp_path, features, "consumer_id long, ds date, tiny_score double, tiny_label string", TINY_ROWS)
    folder = env_conf(
        tmp_path / "conf",
        "ci",
        f"data_root: {tmp_path}\ndefinitions_dir: {tmp_path / 'defs'}\nledger_root: {tmp_path / 'ledger'}\n"
        f"quarantine_root: {tmp_path / 'q'}\nreports_dir: {tmp_path / 'reports'}\n"
        f"sinks: [redis, sql]\nredis:\n  url: {redis_server.url}\n  sample_entities: 20\n"
        f"sql:\n  dsn: '{pg_server.dsn}'\n  password_env: null\n"
        "quality:\n  expectations: false\n  verify_sample: 20\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    from fm_config import load_config

    return load_config("ci"), defs


def test_an_emptied_store_is_named_by_the_run_the_plan_and_doctor_until_the_named_backfill_restores_it(
    spark, tiny, redis_db, pg_db, capsys
):
    conf, defs = tiny
    run = ["run", "--env", "ci", "--source", TINY, "--date"]
    assert main([*run, str(DAY1)]) == EXIT_OK
    night1_redis, night1_sql = redis_state(redis_db), sql_state(pg_db)
    assert len(night1_redis) == len(night1_sql) == 40

    redis_db.flushall()  # between nights, both stores lose what they held
    pg_db.execute("TRUNCATE consumer_features")
    capsys.readouterr()
    # the night's run still writes its snapshot, and exits 6 naming the loss and the backfill
    assert main([*run, str(DAY2)]) == EXIT_STORE_LOST
    out, err = capsys.readouterr()
    restore = f"materialize backfill --env ci --source {TINY} --start {DAY1} --end {DAY1}"
    assert f"STORE LOST DATA: redis at {conf.redis.url} no longer holds {TINY}'s data of {DAY1}" in out
    assert "STORE LOST DATA: sql at postgresql://" in out and f"restore it: {restore}" in out
    assert f"restore it: {restore}" in err.splitlines()
    redis_line = next(line for line in err.splitlines() if line.startswith("store lost data: redis"))  # 41: 40 entities, the description
    assert (
        f"0 of 20 {TINY} entities sampled by the run of {DAY1} still hold its data; db 0 holds 0 keys, the run of {DAY1} left 41"
        in (  # 40 entities and the description
            redis_line
        )
    )
    sql_line = next(line for line in err.splitlines() if line.startswith("store lost data: sql"))
    assert sql_line.endswith(
        f"0 rows of it now, the run of {DAY1} left 40; the table was emptied or rewritten since (TRUNCATE, VACUUM FULL)"
    )
    night2_redis, night2_sql = redis_state(redis_db), sql_state(pg_db)
    assert set(night2_redis) == {f"c:{i}".encode() for i in range(21, 61)} and len(night2_sql) == 40  # its snapshot alone

    # the plan does not call the lost date written; the night's run wrote its own
    plan = ["backfill", "--env", "ci", "--source", TINY, "--start", str(DAY1), "--end", str(DAY2)]
    assert main([*plan, "--dry-run"]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"already written:  {DAY2} (skipped" in out and f"to write:         {DAY1}\n" in out
    assert f"lost:             {DAY1} (redis at {conf.redis.url} no longer holds them: found at " in out

    # doctor fails a check per store, naming the backfill (the ledger read without Spark)
    checks = {c.name: c for c in run_checks(conf, defs, [TINY], ["redis", "sql"])}
    for name in ("redis data tiny", "sql data tiny"):
        assert checks[name].status == "fail" and f"lost {TINY}'s data of {DAY1}: found at " in checks[name].detail, checks[name]
        assert restore in checks[name].fix
    ledger = Ledger.of(spark, conf)
    by_spark = {r["run_id"]: (r["status"], r["stores"]) for r in ledger.steps().collect()}
    without = read_steps(conf.files, str(conf.ledger_path), ("run_id", "status", "stores"))
    assert {r["run_id"]: (r["status"], r["stores"]) for r in without} == by_spark and len(by_spark) == 2
    assert set(ledger.written_dates(TINY, sink_targets(conf))) == {DAY2}  # the loss is in the ledger

    # the named backfill restores both stores to what the two nights leave in stores never emptied
    assert main(restore.split()[1:]) == EXIT_OK
    assert redis_state(redis_db) == night1_redis | night2_redis
    assert sql_state(pg_db) == night1_sql | night2_sql
    assert set(ledger.written_dates(TINY, sink_targets(conf))) == {DAY1, DAY2}
    checks = {c.name: c for c in check_stored_data(conf, defs, [TINY], ["redis", "sql"])}
    assert checks["redis data tiny"].status == checks["sql data tiny"].status == "ok"
    assert checks["redis data tiny"].detail.startswith(
        f"{conf.redis.url}: 20 of 20 {TINY} entities sampled by the backfill-latest of {DAY1}..{DAY2} still hold its data"
    )


def kill(server) -> None:
    server.process.kill()  # no shutdown save
    server.process.wait()


def test_a_restart_loses_the_writes_since_its_last_save_and_names_only_their_dates(tmp_path):
    """The comparison on a real redis-server killed and restarted (ledger rows as write steps record them)."""
    server = start_redis(tmp_path / "redis")
    try:
        config = redis_sink_config(RunConf(redis=RedisSettings(url=server.url, password_env=None)))
        fresh = freshness_field(SOURCE)
        night1, night2 = [f"c:{i}" for i in range(40)], [f"c:{i}" for i in range(40, 80)]
        now = dt.datetime.now(dt.UTC)

        def write(keys: list[str], day: dt.date, hours_ago: int) -> dict:
            for k in keys:
                server.client().hset(k, mapping={fresh: b"1"})
            after = {**identity.observe(config, False), "sample": keys[:32]}
            ended = now - dt.timedelta(hours=hours_ago)
            return {
                "run_id": str(day), "kind": "run", "source": SOURCE, "status": "succeeded", "dates": [day],
                "targets": json.dumps({"redis": server.url}), "started_at": ended - dt.timedelta(minutes=5), "ended_at": ended,
                "stores": json.dumps({"redis": {"after": after}}),
            }  # fmt: skip

        steps = [write(night1, DAY1, 24)]
        server.client().set("other-app", b"x")
        server.client().save()  # an RDB snapshot holding the first night
        steps.append(write(night2, DAY2, 1))
        assert json.loads(steps[1]["stores"])["redis"]["after"]["keys"] == 81

        def check(steps=steps, ttl=30 * 86400):
            seen = identity.observe(config, False)
            held = lambda sample: identity.holding(config, False, sample, fresh)  # noqa: E731
            return compare(steps, SOURCE, "redis", server.url, seen, held, ttl_seconds=ttl, ttl_jitter=0.1)

        assert check().lost == [] and check().warning is None
        kill(server)  # restarted from the snapshot: the second night is gone, the first is not
        server = start_redis(tmp_path / "redis", port=server.port)
        second = check()
        assert second.lost == second.found_now == [DAY2]
        assert second.evidence.startswith(f"0 of 32 {SOURCE} entities sampled by the run of {DAY2} still hold its data; db 0 holds 41 keys")
        assert "the run of 2026-11-20 left 81; another run id (127.0.0.1:" in second.evidence
        assert "loaded 41 keys (AOF off, no RDB save points)" in second.evidence

        kill(server)  # and without the snapshot: both nights
        (tmp_path / "redis" / "dump.rdb").unlink()
        server = start_redis(tmp_path / "redis", port=server.port)
        both = check()
        assert both.lost == [DAY1, DAY2] and "db 0 holds 0 keys" in both.evidence and "loaded 0 keys" in both.evidence
        # keys past the TTL had expired anyway: with a TTL of 2 hours the first night is not lost
        assert check(ttl=2 * 3600).lost == [DAY2]

        # a few deleted is a warning; a last write older than the keys' TTL cannot tell
        for k in night1 + night2:
            server.client().hset(k, mapping={fresh: b"1"})
        server.client().delete(*night2[:3])
        partial = check()
        assert partial.lost == [] and "29 of 32" in partial.warning
        server.client().flushall()
        past = check(ttl=3600)
        assert past.lost == [] and "older than the keys' TTL" in past.evidence
    finally:
        server.stop()


def test_a_dropped_or_recreated_sql_table_is_a_loss_of_every_date_written_to_it(pg_server, pg_db):
    """The comparison on a real PostgreSQL (ledger rows as write steps record them)."""
    from sinks.sql import identity as sql_identity
    from sinks.sql.config import sql_sink_config
    from sinks.sql.statements import create_table
    from stores.sql import connect

    conf = RunConf(sql=SqlSettings(dsn=pg_server.dsn, password_env=None))
    config = sql_sink_config(conf, DEFS.source(SOURCE), DEFS.entities["consumer"])
    pg_db.execute(create_table(config.table_id, "postgres"))
    now = dt.datetime.now(dt.UTC)
    steps = []
    for n, day in enumerate(SAMPLE_DATES):
        keys = [str(i) for i in range(40 * n, 40 * n + 40)]
        pg_db.cursor().executemany("INSERT INTO consumer_features VALUES (%s, %s, '{}', now())", [(k, SOURCE) for k in keys])
        with connect(config) as conn:
            after = {**sql_identity.observe(conn, config), "sample": keys[:32]}
        ended = now - dt.timedelta(days=len(SAMPLE_DATES) - n)
        steps.append({
            "run_id": str(day), "kind": "run", "source": SOURCE, "status": "succeeded", "dates": [day],
            "targets": json.dumps({"sql": pg_server.dsn}), "started_at": ended, "ended_at": ended,
            "stores": json.dumps({"sql": {"after": after}}),
        })  # fmt: skip
    assert json.loads(steps[1]["stores"])["sql"]["after"]["rows"] == 80

    def check():
        with connect(config) as conn:
            seen = sql_identity.observe(conn, config)
            return compare(steps, SOURCE, "sql", pg_server.dsn, seen, lambda keys: sql_identity.holding(conn, config, keys))

    assert check().lost == []
    pg_db.execute("DROP TABLE consumer_features")
    gone = check()  # no TTL on rows: every date written is lost
    assert gone.lost == gone.found_now == list(SAMPLE_DATES)
    assert (
        gone.evidence
        == f"0 of 32 {SOURCE} entities sampled by the run of {DAY2} still hold its data; its table is gone, the run of {DAY2} left 80"
    )
    pg_db.execute(create_table(config.table_id, "postgres"))
    again = check()
    assert again.lost == list(SAMPLE_DATES) and again.evidence.endswith(
        "0 rows of it now, the run of 2026-11-20 left 80; the table was dropped and made again"
    )


def test_ledger_rows_recorded_under_the_sql_stores_old_name_count_as_sql(tmp_path):
    """Steps recorded before the SQL store was named sql say cockroach (targets, stores): the
    dates they wrote, the loss one of them found and the comparison read them as sql's."""
    dsn = "postgresql://root@db:26257/features"
    t0 = dt.datetime(2026, 11, 20, 1, tzinfo=dt.UTC)
    after = {"server": "a", "table_oid": 7, "rows": 40, "sample": ["c:1", "c:2"]}

    def step(day: dt.date, started: dt.datetime, stores: dict, name: str) -> dict:
        return {
            "run_id": str(day), "kind": "run", "source": SOURCE, "status": "succeeded", "dates": [day], "features": ["f"],
            "targets": json.dumps({name: dsn}), "started_at": started, "ended_at": started + dt.timedelta(minutes=5),
            "stores": json.dumps({name: stores}),
        }  # fmt: skip

    def steps(name: str) -> list[dict]:
        return [
            step(DAY1, t0, {"after": after}, name),
            step(
                DAY2, t0 + dt.timedelta(days=1), {"lost": {"dates": [str(DAY1)], "evidence": "emptied"}, "after": after}, name
            ),  # found DAY1 lost
        ]

    ledger = Ledger(None, tmp_path / "ledger")
    for name in ("cockroach", "sql"):  # as the version before wrote them, and as this one does
        assert ledger.written_dates(SOURCE, {"sql": dsn}, steps(name)) == {DAY2: {"f"}}
        seen = {"server": "a", "table_oid": 7, "rows": 40}
        found = compare(steps(name), SOURCE, "sql", dsn, seen, lambda sample: len(sample))
        assert found.lost == [DAY1] and found.found_now == []
        gone = compare(steps(name), SOURCE, "sql", dsn, {"server": "a", "table_oid": None, "rows": None}, lambda sample: None)
        assert gone.lost == [DAY1, DAY2] and gone.evidence.startswith(f"0 of 2 {SOURCE} entities sampled by the run of {DAY2}")
