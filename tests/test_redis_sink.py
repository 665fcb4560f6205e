"""The Redis sink's own write path (RESP on redis-py's socket), against a real server."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
import redis

from serializers.batch import encode_batch
from sinks.redis.node import CeilingReached, KeysEvicted, RedisRestarted, RedisSink
from stores.redis import info_once_loaded
from throwaway.servers import start_redis

from .expected import expected_hash, row_of
from .support.redis_sink import FRESH, SPECS, sink_config, things


def test_batch_writes_exact_hashes_deletes_nulls_and_sets_ttl(redis_db, redis_server):
    batch = things(10)
    # a stale value of a feature that is null now, and another source's field, on every key
    for i in range(10):
        redis_db.hset(f"t:{i}", mapping={SPECS[0].field: b"old", SPECS[2].field: b"old", b"othr": b"keep"})
    stamps = pa.array([1700000000 + i for i in range(10)], pa.int64())
    with RedisSink(sink_config(redis_server.url, ttl_seconds=1000, ttl_jitter=0.1)) as sink:
        stats = sink.write_batch(encode_batch(batch, SPECS), stamps)
    nulls = sum(batch.column(s.name).null_count for s in SPECS)
    assert (stats.entities, stats.values_set, stats.values_deleted) == (10, 30 - nulls, nulls)
    assert sink.stats.round_trips == 4  # 10 entities in chunks of 3
    for i in range(10):
        assert redis_db.hgetall(f"t:{i}") == expected_hash(SPECS, row_of(batch, i), FRESH, 1700000000 + i, {b"othr": b"keep"})
        assert 1000 - 5 <= redis_db.ttl(f"t:{i}") <= 1100


def test_dropped_connection_is_resent_on_a_new_one(redis_db, redis_server):
    first, second = things(7), things(7, offset=100)
    with RedisSink(sink_config(redis_server.url)) as sink:
        sink.write_batch(encode_batch(first, SPECS))
        # the server drops the sink's connections; the next batch reconnects and sends its chunks again
        killed = redis_db.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        sink.write_batch(encode_batch(second, SPECS))
    assert sink.stats.retries >= 1
    assert sink.stats.entities == 14
    for batch, offset in ((first, 0), (second, 100)):
        for i in range(7):
            assert redis_db.hgetall(f"t:{offset + i}") == expected_hash(SPECS, row_of(batch, i), FRESH, 1700000000)


def test_ceiling_is_rechecked_when_a_batch_is_one_chunk(redis_db, redis_server):
    # one chunk per batch: every acknowledgement is a batch's last, and must count too
    used = int(redis_db.info("memory")["used_memory"])
    config = sink_config(redis_server.url, chunk_entities=50, recheck_every=2, ceiling_bytes=used + 1_000_000)
    batches = [encode_batch(things(50, offset=100 * b), SPECS) for b in range(4)]
    with RedisSink(config) as sink:
        sink.write_batch(batches[0])  # chunk 1: no check due
        redis_db.set("ballast", b"x" * 2_000_000)  # someone else fills the server
        with pytest.raises(CeilingReached) as info:
            sink.write_batch(batches[1])  # chunk 2: the check is due and finds the ceiling passed
    assert info.value.stats.entities == 100 == redis_db.dbsize() - 1  # the report says what is in Redis


def test_redis_maxmemory_mid_write_stops_with_an_exact_report_and_whole_hashes(tmp_path):
    # No ceiling of ours: Redis's own maxmemory (noeviction) refuses HSETs mid-write.
    server = start_redis(tmp_path / "full", "--maxmemory", "3mb", "--maxmemory-policy", "noeviction")
    try:
        client = server.client()
        batches = [things(1000, offset=1000 * b) for b in range(40)]  # far more than 3 MB holds
        with RedisSink(sink_config(server.url, chunk_entities=64)) as sink:
            with pytest.raises(CeilingReached) as info:
                for batch in batches:
                    sink.write_batch(encode_batch(batch, SPECS))
        written = client.dbsize()
        assert 0 < written < 40_000
        # the report counts exactly what Redis holds ...
        assert info.value.stats.entities == written
        assert f"after {written:,} entities" in str(info.value)
        # ... and every hash is whole: all of its entity's values, or no key at all
        for key in client.scan_iter():
            n = int(key.split(b":")[1])
            assert client.hgetall(key) == expected_hash(SPECS, row_of(batches[n // 1000], n % 1000), FRESH, 1700000000)
    finally:
        server.stop()


def test_restart_without_persistence_mid_write_is_not_taken_for_success(tmp_path):
    # the server comes back empty: resending the pending chunks would leave the earlier keys missing
    server = start_redis(tmp_path / "volatile")
    restarted = None
    try:
        with RedisSink(sink_config(server.url)) as sink:
            sink.write_batch(encode_batch(things(7), SPECS))
            server.process.kill()
            server.process.wait()
            restarted = start_redis(tmp_path / "volatile", port=server.port)
            with pytest.raises(RedisRestarted, match=r"restarted during the write without persistence .* rerun the date"):
                sink.write_batch(encode_batch(things(7, offset=100), SPECS))
        assert restarted.client().dbsize() == 0  # what was acknowledged before is indeed gone
    finally:
        for s in (server, restarted):
            if s and s.process.poll() is None:
                s.stop()


def test_a_restart_with_persistence_is_waited_for_while_it_loads(tmp_path):
    # While Redis loads its append-only file it answers INFO with aof_enabled:0 (AOF is off
    # until the load ends): a writer that reconnects then must wait, not stop the run.
    aof = ("--appendonly", "yes", "--appendfsync", "always")
    server = start_redis(tmp_path / "aof", *aof)
    restarted: list = []
    try:
        client = server.client()
        client.eval("for i = 1, 3000 do redis.call('SET', 'pad:' .. i, i) end", 0)  # keys that take a while to load
        with RedisSink(sink_config(server.url, retries=10)) as sink:
            sink.write_batch(encode_batch(things(7), SPECS))
            client.bgrewriteaof()  # the keys in an RDB preamble, which key-load-delay slows (1 ms a key)
            while int(client.info("persistence")["aof_rewrite_in_progress"]) or int(client.info("persistence")["aof_rewrite_scheduled"]):
                time.sleep(0.05)
            server.process.kill()
            server.process.wait()
            slow = ("--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024")
            starter = threading.Thread(target=lambda: restarted.append(start_redis(tmp_path / "aof", *aof, *slow, port=server.port)))
            starter.start()
            probe = redis.Redis(port=server.port, socket_timeout=5)
            deadline = time.monotonic() + 20
            while True:  # until the server is up and loading
                try:
                    if int(probe.info("persistence")["loading"]):
                        break
                except redis.ConnectionError:
                    pass
                assert time.monotonic() < deadline, "the restarted server was never seen loading"
                time.sleep(0.01)
            with pytest.raises(redis.BusyLoadingError, match="still loading its data after 0 s"):
                info_once_loaded(probe, "server", wait_s=0)
            sink.write_batch(encode_batch(things(7, offset=100), SPECS))  # reconnects while the server loads
            starter.join(timeout=30)
        assert sink.stats.retries >= 1 and int(probe.info("persistence")["aof_enabled"]) == 1
        assert probe.dbsize() == 3014  # the padding and both batches: nothing acknowledged was lost
        for batch, offset in ((things(7), 0), (things(7, offset=100), 100)):
            for i in range(7):
                assert probe.hgetall(f"t:{offset + i}") == expected_hash(SPECS, row_of(batch, i), FRESH, 1700000000)
    finally:
        for s in (server, *restarted):
            if s.process.poll() is None:
                s.stop()


def test_an_older_snapshot_never_replaces_a_newer_one(redis_db, redis_server):
    old, new = things(10), things(10, offset=0)
    with RedisSink(sink_config(redis_server.url, as_of=1700000500)) as sink:
        sink.write_batch(encode_batch(new, SPECS))
    written = {i: redis_db.hgetall(f"t:{i}") for i in range(10)}
    # the same entities as of an earlier time, with other values: every one is left as it is
    older = pa.RecordBatch.from_pydict({**old.to_pydict(), "score": pa.array([99.5] * 10, pa.float64())}, schema=old.schema)
    with RedisSink(sink_config(redis_server.url, as_of=1700000000)) as sink:
        stats = sink.write_batch(encode_batch(older, SPECS))
    assert (stats.entities, stats.skipped_newer, stats.values_set, stats.values_deleted) == (0, 10, 0, 0)
    assert {i: redis_db.hgetall(f"t:{i}") for i in range(10)} == written
    # per row: entities 0-4 older than stored, 5-9 as of the same time (a rerun writes again)
    stamps = pa.array([1700000499] * 5 + [1700000500] * 5, pa.int64())
    with RedisSink(sink_config(redis_server.url)) as sink:
        stats = sink.write_batch(encode_batch(older, SPECS), stamps)
    assert (stats.entities, stats.skipped_newer) == (5, 5)
    for i in range(10):
        want = written[i] if i < 5 else expected_hash(SPECS, row_of(older, i), FRESH, 1700000500)
        assert redis_db.hgetall(f"t:{i}") == want


def test_two_writers_racing_leave_the_newer_snapshot_on_every_key(redis_db, redis_server):
    # a nightly run and a backfill of an older date writing the same keys at the same time
    import threading

    batches = [things(500, offset=500 * b) for b in range(4)]
    errors: list[BaseException] = []

    def write(as_of: int) -> None:
        try:
            with RedisSink(sink_config(redis_server.url, as_of=as_of, chunk_entities=50)) as sink:
                for batch in batches:
                    sink.write_batch(encode_batch(batch, SPECS))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    for _ in range(3):
        redis_db.flushall()
        threads = [threading.Thread(target=write, args=(t,)) for t in (1700000000, 1700086400)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        stamps = redis_db.pipeline(transaction=False)
        for n in range(2000):
            stamps.hget(f"t:{n}", FRESH)
        assert set(stamps.execute()) == {b"1700086400"}


def test_out_of_memory_refuses_an_entity_whole_and_keeps_its_old_values(tmp_path):
    # The new snapshot has null features where the stored one has values: a refused entity
    # must keep every old value (its deletes must not run without its sets).
    server = start_redis(tmp_path / "oom", "--maxmemory-policy", "noeviction")
    try:
        client = server.client()
        full = pa.RecordBatch.from_pydict(
            {"_id": [str(i) for i in range(200)], "score": pa.array([1.5] * 200, pa.float64()),
             "ids": pa.array([[7, 8]] * 200, pa.list_(pa.int64())), "flag": pa.array([True] * 200, pa.bool_())}
        )  # fmt: skip
        with RedisSink(sink_config(server.url, as_of=1700000000)) as sink:
            sink.write_batch(encode_batch(full, SPECS))
        before = {k: client.hgetall(k) for k in client.keys()}
        used = int(client.info("memory")["used_memory"])
        client.config_set("maxmemory", str(used - 50_000))  # every write is refused from now on
        with RedisSink(sink_config(server.url, as_of=1700086400)) as sink:
            with pytest.raises(CeilingReached, match="out of memory") as info:
                sink.write_batch(encode_batch(things(200), SPECS))  # nulls in score and flag
        assert info.value.stats.entities == 0
        assert {k: client.hgetall(k) for k in client.keys()} == before
    finally:
        server.stop()


def test_a_key_written_without_ttl_loses_the_expiry_it_had(redis_db, redis_server):
    redis_db.hset("t:0", b"othr", b"keep")
    redis_db.expire("t:0", 5000)
    with RedisSink(sink_config(redis_server.url, ttl_seconds=1000, ttl_jitter=0.0)) as sink:
        sink.write_batch(encode_batch(things(1), SPECS))
    assert 995 <= redis_db.ttl("t:0") <= 1000  # the entity type's TTL replaces the old one
    with RedisSink(sink_config(redis_server.url)) as sink:  # ttl_seconds removed from the definition
        sink.write_batch(encode_batch(things(1), SPECS))
    assert redis_db.ttl("t:0") == -1  # no expiry left over from the old definition
    assert redis_db.hget("t:0", b"othr") == b"keep"


def test_a_restart_before_a_writer_starts_is_caught_from_the_drivers_baseline(tmp_path):
    # The driver reads run_id before any write; a server restarted (empty, no AOF) between two
    # waves of writer tasks is caught by the later writers, which never saw the first run_id.
    server = start_redis(tmp_path / "waves")
    restarted = None
    try:
        baseline = server.client().info("server")["run_id"]
        address = f"127.0.0.1:{server.port}"
        config = sink_config(server.url, run_ids=((address, baseline),))
        with RedisSink(config) as sink:  # the first wave
            sink.write_batch(encode_batch(things(7), SPECS))
        server.process.kill()
        server.process.wait()
        restarted = start_redis(tmp_path / "waves", port=server.port)
        with pytest.raises(RedisRestarted, match=r"restarted during the write without persistence .* rerun the date"):
            with RedisSink(config) as sink:  # a writer of the second wave
                sink.write_batch(encode_batch(things(7, offset=100), SPECS))
    finally:
        for s in (server, restarted):
            if s and s.process.poll() is None:
                s.stop()


def test_evictions_during_the_write_stop_the_writer(tmp_path):
    server = start_redis(tmp_path / "lru", "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru")
    try:
        client = server.client()
        evicted = int(client.info("stats")["evicted_keys"])
        config = sink_config(server.url, chunk_entities=64, recheck_every=1, evicted_keys=((f"127.0.0.1:{server.port}", evicted),))
        with pytest.raises(KeysEvicted, match=r"evicted [\d,]+ key\(s\) during the write \(maxmemory-policy allkeys-lru\)"):
            with RedisSink(config) as sink:
                for b in range(40):  # far more than 3 MB holds
                    sink.write_batch(encode_batch(things(1000, offset=1000 * b), SPECS))
        assert int(client.info("stats")["evicted_keys"]) > evicted
    finally:
        server.stop()


def test_event_times_within_one_second_are_ordered_by_their_microseconds(redis_db, redis_server):
    # issue 62, item 1: a table row at 10:00:00.100 replaced a push at 10:00:00.900 (the stores compared whole seconds)
    from dataclasses import replace

    from serializers.keys import subsecond_field

    sub = subsecond_field("things")
    config = sink_config(redis_server.url, subsecond_field=sub)
    batch = things(3)

    def write(values: pa.RecordBatch, second: int, micros: list[int]):
        encoded = replace(encode_batch(values, SPECS), subsecond=pa.array(micros, pa.int64()))
        with RedisSink(config) as sink:
            return sink.write_batch(encoded, pa.array([second] * 3, pa.int64()))

    other = pa.RecordBatch.from_pydict({**batch.to_pydict(), "score": pa.array([7.5] * 3, pa.float64())}, schema=batch.schema)
    stats = write(batch, 1700000500, [900_000, 900_000, 0])
    assert stats.entities == 3 and redis_db.hget("t:0", sub) == b"900000" and redis_db.hget("t:2", sub) is None
    # the same second, fewer microseconds: older, left (entity 2 held .0, so .1 is newer there)
    stats = write(other, 1700000500, [100_000, 899_999, 100_000])
    assert (stats.entities, stats.skipped_newer) == (1, 2)
    for i in (0, 1):
        assert redis_db.hgetall(f"t:{i}") == expected_hash(SPECS, row_of(batch, i), FRESH, 1700000500, {sub: b"900000"})
    assert redis_db.hgetall("t:2") == expected_hash(SPECS, row_of(other, 2), FRESH, 1700000500, {sub: b"100000"})
    # an equal time is written again; a later whole second deletes the sub-second field
    assert write(other, 1700000500, [900_000, 900_000, 100_000]).entities == 3
    assert redis_db.hgetall("t:0") == expected_hash(SPECS, row_of(other, 0), FRESH, 1700000500, {sub: b"900000"})
    assert write(batch, 1700000501, [0, 0, 0]).entities == 3
    assert [redis_db.hgetall(f"t:{i}") for i in range(3)] == [expected_hash(SPECS, row_of(batch, i), FRESH, 1700000501) for i in range(3)]
