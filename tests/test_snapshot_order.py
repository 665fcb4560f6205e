"""An older snapshot never replaces a newer one, in either store, whoever writes it; and
Redis states the writer cannot see from its replies (a policy that evicts) stop the run."""

from __future__ import annotations

import datetime as dt

import pytest

from feature_defs import load_definitions
from jobs.pipeline.run import run_source
from serializers import field_id, freshness_field_name
from serializers.keys import as_of_epoch
from sinks.errors import CapacityError
from sinks.redis.capacity import read_memory_info
from sinks.redis.config import redis_sink_config
from sinks.redis.node import KeysEvicted, RedisRestarted
from sinks.redis.preflight import check_after_write
from throwaway.servers import start_redis

from .support.samples import SAMPLE_DATES

DEFS = load_definitions()
DAY1, DAY2 = SAMPLE_DATES
FRESH = field_id(freshness_field_name("consumer_daily"))


def redis_dump(client) -> dict[bytes, dict[bytes, bytes]]:
    return {k: client.hgetall(k) for k in client.scan_iter(match="c:*")}


def sql_dump(conn) -> dict[str, tuple[str, dt.datetime]]:
    rows = conn.execute("SELECT entity_key, features::text, as_of FROM consumer_features WHERE source = 'consumer_daily'")
    return {k: (doc, as_of) for k, doc, as_of in rows}


def test_an_older_date_after_a_newer_one_leaves_what_the_newer_wrote(spark, sql_conf, redis_db, pg_db):
    conf = sql_conf.model_copy(update={"sinks": ["redis", "sql"]})
    newer = run_source(spark, conf, DEFS, "consumer_daily", DAY2)
    assert newer.status == "succeeded"
    redis_after_newer, sql_after_newer = redis_dump(redis_db), sql_dump(pg_db)
    assert {h[FRESH] for h in redis_after_newer.values()} == {str(as_of_epoch(DAY2)).encode()}

    older = run_source(spark, conf, DEFS, "consumer_daily", DAY1)
    assert older.status == "succeeded"
    redis_now, sql_now = redis_dump(redis_db), sql_dump(pg_db)
    # every entity the newer date wrote is exactly as it left it, in both stores
    assert {k: redis_now[k] for k in redis_after_newer} == redis_after_newer
    assert {k: sql_now[k] for k in sql_after_newer} == sql_after_newer
    # entities only the older date has are written, as of that date
    only_older = set(redis_now) - set(redis_after_newer)
    assert {redis_now[k][FRESH] for k in only_older} <= {str(as_of_epoch(DAY1)).encode()}
    assert len(set(sql_now) - set(sql_after_newer)) == len(only_older)
    # counted and reported, not errors: the older date's entities that the newer one holds
    kept = older.entities - len(only_older)
    assert kept > 0
    assert older.sinks["redis"]["skipped_newer"] == kept and older.sinks["redis"]["entities"] == len(only_older)
    assert older.sinks["sql"]["rows_skipped_newer"] == kept and older.sinks["sql"]["rows_upserted"] == len(only_older)
    assert any(f"{kept:,} entities already hold a newer snapshot" in w for w in older.warnings)
    # the read-back sample finds the newer snapshot where it was kept, and no mismatch
    for store in ("redis", "sql"):
        assert older.verification[store]["mismatches"] == 0 and older.verification[store]["newer"] > 0


@pytest.mark.parametrize("policy", ["allkeys-lru", "volatile-ttl"])
def test_a_policy_that_may_evict_this_runs_keys_is_refused_before_writing(spark, run_conf, tmp_path, policy):
    server = start_redis(tmp_path / "lru", "--maxmemory", "256mb", "--maxmemory-policy", policy, "--hash-max-listpack-value", "256")
    try:
        conf = run_conf.model_copy(update={"redis": run_conf.redis.model_copy(update={"url": server.url})})
        # consumer keys have a TTL, so volatile-* may evict them as well as allkeys-*
        with pytest.raises(CapacityError, match=rf"maxmemory-policy may evict consumer keys .*\({policy}\).*Nothing was written"):
            run_source(spark, conf, DEFS, "consumer_daily", DAY2)
        assert server.client().dbsize() == 0
    finally:
        server.stop()


def test_an_allowed_policy_writes_with_a_warning_and_evictions_fail_the_check_after_the_write(spark, run_conf, tmp_path):
    server = start_redis(tmp_path / "lru", "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru", "--hash-max-listpack-value", "256")
    try:
        client = server.client()
        conf = run_conf.model_copy(update={"redis": run_conf.redis.model_copy(update={"url": server.url, "eviction": "warn"})})
        summary = run_source(spark, conf, DEFS, "consumer_daily", DAY2)
        assert summary.status == "succeeded" and summary.sinks["redis"]["evicted_keys"] == 0
        assert any("allkeys-lru" in w and "redis.eviction: warn" in w for w in summary.warnings)
        # The check after the last write compares with the baselines the driver took before
        # any write: keys evicted in between (here, by squeezing maxmemory) fail the run.
        sink_conf = redis_sink_config(conf, DEFS.sources["consumer_daily"], DEFS.entities["consumer"], DAY2)
        before = {f"127.0.0.1:{server.port}": read_memory_info(client)}
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) - 100_000))
        client.set("one-more", b"x" * 1000)  # a write makes Redis evict down to maxmemory
        with pytest.raises(KeysEvicted, match=r"Redis evicted [\d,]+ key\(s\) during the write"):
            check_after_write(sink_conf, before, True, {})
    finally:
        server.stop()


def test_a_restart_without_persistence_is_caught_by_the_check_after_the_write(spark, run_conf, tmp_path):
    server = start_redis(tmp_path / "volatile")
    restarted = None
    try:
        conf = run_conf.model_copy(update={"redis": run_conf.redis.model_copy(update={"url": server.url})})
        sink_conf = redis_sink_config(conf, DEFS.sources["consumer_daily"], DEFS.entities["consumer"], DAY2)
        before = {f"127.0.0.1:{server.port}": read_memory_info(server.client(), 512, 64)}
        server.process.kill()  # after the writers' last chunk, before the driver looks again
        server.process.wait()
        restarted = start_redis(tmp_path / "volatile", port=server.port)
        with pytest.raises(RedisRestarted, match=r"restarted during the run without persistence .* rerun the date"):
            check_after_write(sink_conf, before, True, {})
    finally:
        for s in (server, restarted):
            if s and s.process.poll() is None:
                s.stop()
