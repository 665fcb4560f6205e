"""The entity TTL in the SQL store (serializers/FORMAT.md, "SQL layout"): rows expire with
their Redis keys, no reader serves one past it, a write moves the expiry of the entity's
other sources' rows as a Redis hash shares its TTL, and a table made before the column is
brought up to the layout by its owner alone. Real PostgreSQL (and Redis and Spark where the
real job writes); expired rows are made by a short TTL, or by moving a row's expiry into
the past in the database (the clock a TTL is judged by)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from dataclasses import replace

import psycopg
import pytest

from feature_defs import load_definitions
from feature_reader import AsyncFeatureReader, FeatureReader
from fm_config import QualityConf, RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.operations.cleanup.sql import SqlCleanupError, clean_sql, plan_sql_cleanup
from jobs.operations.schema import ensure_tables
from serializers.keys import as_of_epoch, ttl_with_jitter
from sinks.errors import TerminalSinkError
from sinks.sql.config import sql_sink_config
from sinks.sql.preflight import ensure_schema
from sinks.sql.upserts import SqlSink

from .support.samples import SAMPLE_DATES

DAY = SAMPLE_DATES[1]
TTL = 3  # seconds; jitter adds int(3 * 0.1) = 0
ENTITIES = (
    "entities:\n  - {name: consumer, prefix: c, keys: [{name: consumer_id, type: int}], ttl_seconds: %d, sql_table: consumer_features}\n"
)
TINY = """source:
  name: tiny
  entity: consumer
  location: tiny
  layout: wide
  features:
    - {name: tiny_score, type: float}
    - {name: tiny_label, type: string}
"""
IDS = [1, 2, 3, 4, 5]
NEVER = 6  # never written


def tiny_defs(tmp_path, ttl: int):
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "entities.yaml").write_text(ENTITIES % ttl)
    (folder / "tiny.yaml").write_text(TINY)
    return load_definitions(folder)


def statuses(result, name: str) -> list[str]:
    return result.column(name).statuses


def test_after_the_ttl_sql_answers_not_found_as_redis_does(spark, tmp_path, redis_db, redis_server, pg_server, pg_db):
    defs = tiny_defs(tmp_path, TTL)
    rows = [(i, i / 4, f"label-{i}", DAY) for i in IDS]
    spark.createDataFrame(rows, "consumer_id long, tiny_score double, tiny_label string, ds date").write.format("delta").save(
        str(tmp_path / "tiny")
    )
    conf = RunConf(
        env="test", data_root=str(tmp_path), reports_dir=str(tmp_path / "reports"), quarantine_root=str(tmp_path / "q"),
        sinks=["redis", "sql"], redis=RedisSettings(url=redis_server.url, password_env=None, mode="standalone"),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        # no read-back: a key may expire before it would be read
        quality=QualityConf(expectations=False, verify_sample=0), reader=ReaderSettings(timeout_ms=5000),
    )  # fmt: skip
    from jobs.pipeline.run import run_source

    start = time.time()
    summary = run_source(spark, conf, defs, "tiny", DAY)
    end = time.time()
    assert summary.status == "succeeded", summary.error
    # Both stores count the TTL from the write, on their server's clock (the same here)
    expiry = dict(pg_db.execute("SELECT entity_key, extract(epoch FROM expires_at)::float8 FROM consumer_features").fetchall())
    assert sorted(expiry) == sorted(str(i) for i in IDS)
    assert all(start + TTL - 0.01 <= e <= end + TTL + 0.01 for e in expiry.values()), (start, end, expiry)
    for i in IDS:
        at = redis_db.execute_command("PEXPIRETIME", f"c:{i}")
        assert at == -2 or (start + TTL - 0.01) * 1000 <= at <= (end + TTL + 0.01) * 1000  # -2: already gone
    # one entity kept alive in SQL alone: the filter is per row, not "SQL says nothing"
    pg_db.execute("UPDATE consumer_features SET expires_at = now() + INTERVAL '1 hour' WHERE entity_key = '1'")

    time.sleep(max(0.0, max(expiry.values()) + 0.3 - time.time()))
    entities = {"consumer_id": [*IDS, NEVER]}
    gone = ["NOT_FOUND"] * len(IDS)
    with FeatureReader(conf, defs, cache=False) as reader:
        redis = reader.get_online_features(["tiny:tiny_score", "tiny:tiny_label"], entities, store="redis")
        sql = reader.get_online_features(["tiny:tiny_score", "tiny:tiny_label"], entities, store="sql")
        through = reader.get_online_features(["tiny:tiny_score", "tiny:tiny_label"], entities)  # Redis, then SQL for its misses
    assert statuses(redis, "tiny_score") == [*gone, "NOT_FOUND"]
    assert statuses(sql, "tiny_score") == statuses(through, "tiny_score") == ["PRESENT", *gone[1:], "NOT_FOUND"]
    assert sql.column("tiny_label").values[:2] == through.column("tiny_label").values[:2] == ["label-1", None]

    async def read_async():
        async with AsyncFeatureReader(conf, defs, cache=False) as reader:
            return await reader.get_online_features(["tiny:tiny_label"], entities, store="sql")

    assert statuses(asyncio.run(read_async()), "tiny_label") == ["PRESENT", *gone[1:], "NOT_FOUND"]
    # nothing was deleted: the rows are there, past their expiry, until cleanup (or CockroachDB's TTL job)
    assert pg_db.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == len(IDS)


def sql_only_conf(pg_server) -> RunConf:
    return RunConf(env="test", sinks=["sql"], sql=SqlSettings(dsn=pg_server.dsn, password_env=None, retry_base_delay=0.01))


def write(config, keys, as_of: dt.date = DAY):
    with SqlSink(replace(config, as_of=as_of_epoch(as_of))) as sink:
        for key in keys:
            sink.add(key, json.dumps({"tiny_score": 0.5}))
        sink.flush()
        return sink.stats


def expiries(conn, source: str) -> dict[str, dt.datetime | None]:
    return dict(conn.execute("SELECT entity_key, expires_at FROM consumer_features WHERE source = %s", (source,)).fetchall())


def test_expiry_is_the_redis_keys_and_a_write_moves_it_for_the_entitys_other_sources(pg_server, pg_db, tmp_path):
    defs = tiny_defs(tmp_path, 1000)
    conf = sql_only_conf(pg_server)
    # all rows of a write in one transaction: one now() for all
    a = replace(sql_sink_config(conf, defs.source("tiny"), defs.entity("consumer"), DAY), source="a", statements_per_transaction=10)
    assert (a.ttl_seconds, a.ttl_jitter, a.key_prefix) == (1000, 0.1, "c:")
    ensure_schema(pg_db, a)
    keys = [str(i) for i in range(1, 9)]
    assert write(a, keys).rows_upserted == 8
    first = expiries(pg_db, "a")
    # the jitter of each row is its Redis key's: equal seconds apart, to the microsecond
    jitter = {k: ttl_with_jitter(f"c:{k}".encode(), 1000, 0.1) for k in keys}
    assert len(set(jitter.values())) > 4
    assert all((first[k] - first["1"]).total_seconds() == jitter[k] - jitter["1"] for k in keys)
    now = pg_db.execute("SELECT now()").fetchone()[0]
    assert all(jitter[k] - 60 < (first[k] - now).total_seconds() <= jitter[k] for k in keys)

    # source b writes 1, 2 and 3 later; 3 of source a is past its expiry by then (gone)
    pg_db.execute("UPDATE consumer_features SET expires_at = now() - INTERVAL '1 second' WHERE source = 'a' AND entity_key = '3'")
    past = expiries(pg_db, "a")["3"]
    b = replace(a, source="b")
    stats = write(b, ["1", "2", "3"])
    assert (stats.rows_upserted, stats.expiry_followed) == (3, 2)
    after, of_b = expiries(pg_db, "a"), expiries(pg_db, "b")
    assert after["1"] == of_b["1"] != first["1"] and after["2"] == of_b["2"] != first["2"]  # the entity's TTL, as in one Redis hash
    assert after["3"] == past  # stays gone: not brought back by another source's write
    assert {k: after[k] for k in keys[3:]} == {k: first[k] for k in keys[3:]}

    # a newer snapshot past its expiry is gone: an older one replaces it; one still alive is kept
    newer = dt.datetime.combine(DAY + dt.timedelta(days=5), dt.time(), tzinfo=dt.UTC)
    pg_db.execute("UPDATE consumer_features SET as_of = %s WHERE source = 'a' AND entity_key IN ('4', '5')", (newer,))
    pg_db.execute("UPDATE consumer_features SET expires_at = now() - INTERVAL '1 second' WHERE source = 'a' AND entity_key = '4'")
    stats = write(a, ["4", "5"])
    assert (stats.rows_upserted, stats.rows_skipped_newer) == (1, 1)
    as_of = dict(pg_db.execute("SELECT entity_key, as_of FROM consumer_features WHERE source = 'a'").fetchall())
    assert as_of["4"] < newer == as_of["5"] and expiries(pg_db, "a")["4"] > now

    # an entity type no other source writes sends no such UPDATE
    assert write(replace(a, source="d", follow_expiry=False), ["8"]).expiry_followed == 0
    assert expiries(pg_db, "a")["8"] == first["8"]

    # an entity type without TTL: its rows never expire, and a write takes the others' expiry away (PERSIST)
    c = replace(a, source="c", ttl_seconds=None)
    assert write(c, ["1"]).expiry_followed == 2
    assert pg_db.execute("SELECT source FROM consumer_features WHERE entity_key = '1' AND expires_at IS NULL ORDER BY 1").fetchall() == [
        ("a",),
        ("b",),
        ("c",),
    ]


OLD_TABLE = (
    "CREATE TABLE consumer_features (entity_key TEXT NOT NULL, source TEXT NOT NULL, features JSONB NOT NULL, "
    "as_of TIMESTAMPTZ NOT NULL, PRIMARY KEY (entity_key, source))"
)


def test_a_table_made_before_expires_at_is_read_then_brought_up_by_its_owner(pg_server, pg_db, sql_roles, tmp_path):
    defs = tiny_defs(tmp_path, 1000)
    admin = sql_only_conf(pg_server).model_copy(update={"definitions_dir": str(tmp_path / "defs")})
    password = {role: (tmp_path / f"{role}_password").read_text() for role in ("fm_schema", "fm_writer", "fm_cleanup")}

    def as_role(role: str) -> RunConf:
        return admin.model_copy(update={"sql": SqlSettings(dsn=sql_roles[role], password_env=f"FM_TEST_{role.upper()}_PASSWORD")})

    with psycopg.connect(sql_roles["fm_schema"], password=password["fm_schema"], autocommit=True) as owner:
        owner.execute(OLD_TABLE)
        owner.execute(
            "INSERT INTO consumer_features VALUES ('1', 'tiny', '{\"tiny_score\": 0.5}', %s), ('2', 'tiny', '{\"tiny_score\": 1}', %s)",
            (dt.datetime(2026, 11, 21, tzinfo=dt.UTC),) * 2,
        )
    reads = {"consumer_id": [1, 2]}
    with FeatureReader(admin, defs, cache=False) as reader:  # the readers keep reading it as it is
        assert reader.get_online_features(["tiny:tiny_score"], reads, store="sql").column("tiny_score").values == [0.5, 1.0]

    writer = sql_sink_config(as_role("fm_writer"), defs.source("tiny"), defs.entity("consumer"), DAY)
    with pytest.raises(TerminalSinkError, match=r"has no column expires_at .*may not alter it .*`materialize schema --env <env>`"):
        with psycopg.connect(sql_roles["fm_writer"], password=password["fm_writer"], autocommit=True) as conn:
            ensure_schema(conn, writer)

    assert ensure_tables(as_role("fm_schema"), defs, ["tiny"]) == {
        "consumer_features": "exists; added column expires_at (the entity TTL); its rows expire in 1,000 s from now"
    }
    left = pg_db.execute("SELECT extract(epoch FROM expires_at - now())::float8 FROM consumer_features").fetchall()
    assert all(940 < s <= 1000 for (s,) in left), left  # one TTL from the change: never before their Redis keys
    assert pg_db.execute(
        "SELECT column_default FROM information_schema.columns WHERE table_name = 'consumer_features' AND column_name = 'expires_at'"
    ).fetchone() == (None,)
    with psycopg.connect(sql_roles["fm_writer"], password=password["fm_writer"], autocommit=True) as conn:
        assert ensure_schema(conn, writer) is False  # the writer's check passes now
    pg_db.execute("UPDATE consumer_features SET expires_at = now() - INTERVAL '1 second' WHERE entity_key = '2'")
    with FeatureReader(admin, defs, cache=False) as reader:
        assert reader.get_online_features(["tiny:tiny_score"], reads, store="sql").column("tiny_score").statuses == [
            "PRESENT",
            "NOT_FOUND",
        ]

    # cleanup deletes it, as the role conf/base/sql-grants.sql gives what cleanup needs; not as the writer
    refused = clean_sql(as_role("fm_writer"), plan_sql_cleanup(as_role("fm_writer"), defs, "consumer"))
    assert isinstance(refused.error, SqlCleanupError) and "lacks DELETE on it" in str(refused.error) and "fm_cleanup" in str(refused.error)
    done = clean_sql(as_role("fm_cleanup"), plan_sql_cleanup(as_role("fm_cleanup"), defs, "consumer"))
    assert done.error is None and (done.expired_rows, done.rows_visited) == (1, 2)
    assert pg_db.execute("SELECT entity_key FROM consumer_features").fetchall() == [("1",)]
