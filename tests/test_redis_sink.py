"""The Redis sink's own write path (RESP on redis-py's socket), against a real server."""

from __future__ import annotations

import pyarrow as pa
import pytest

from serializers.batch import FeatureSpec, encode_batch
from serializers.scalar import encode, field_id
from sinks.redis_sink import CeilingReached, RedisRestarted, RedisSink, RedisSinkConfig

from .conftest import start_redis

SPECS = [FeatureSpec("score", "float"), FeatureSpec("ids", "int_list"), FeatureSpec("flag", "bool")]
FRESH = field_id("_ts:things")


def sink_config(url: str, **overrides) -> RedisSinkConfig:
    base = dict(url=url, key_prefix="t:", fields=tuple(s.field for s in SPECS), freshness_field=FRESH, as_of=1700000000, chunk_entities=3)
    return RedisSinkConfig(**{**base, **overrides})


def things(n: int, offset: int = 0) -> pa.RecordBatch:
    ids = [str(offset + i) for i in range(n)]
    scores = [None if i % 4 == 1 else i / 8 for i in range(n)]
    lists = [[i, i, 300] for i in range(n)]
    flags = [None if i % 5 == 2 else i % 2 == 0 for i in range(n)]
    return pa.RecordBatch.from_pydict(
        {"_id": ids, "score": pa.array(scores, pa.float64()), "ids": pa.array(lists, pa.list_(pa.int64())), "flag": pa.array(flags, pa.bool_())}
    )


def expected_hash(batch: pa.RecordBatch, row: int, stamp: int, untouched: dict) -> dict[bytes, bytes]:
    """What the hash must hold, from the scalar encoder (not the column path under test)."""
    out = dict(untouched)
    for spec in SPECS:
        value = batch.column(spec.name)[row].as_py()
        if value is not None:
            out[spec.field] = encode(spec.type, value)
    out[FRESH] = str(stamp).encode()
    return out


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
        assert redis_db.hgetall(f"t:{i}") == expected_hash(batch, i, 1700000000 + i, {b"othr": b"keep"})
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
            assert redis_db.hgetall(f"t:{offset + i}") == expected_hash(batch, i, 1700000000, {})


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
            assert client.hgetall(key) == expected_hash(batches[n // 1000], n % 1000, 1700000000, {})
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
