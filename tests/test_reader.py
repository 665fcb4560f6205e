"""The read side (feature_reader/): values the real job wrote read back from Redis and
PostgreSQL with Feast's statuses, read-through, max_age, the request's errors, and the
single-flight scoreboard counted on the server (INFO commandstats)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import redis

from feature_defs import DEFAULT_DIR, load_definitions
from feature_reader import AsyncFeatureReader, EntityKeyError, FeatureReader, RequestError, StoreError, UnknownNameError
from fm_config import RunConf
from fm_config.reader import ReaderSettings
from serializers import encode, field_id, freshness_field
from throwaway.servers import start_redis

from .support.confs import reader_conf
from .support.every_type import AS_OF, BIG, CONSUMERS, DAY, EXPECTED
from .support.reader_sample import assert_expected


def test_every_type_reads_back_as_written_from_redis_and_sql(written_sample):
    conf, defs = written_sample
    with FeatureReader(conf, defs, cache=False, clock=lambda: AS_OF + 60) as reader:  # pair_daily's max_age is an hour
        for store in ("redis", "sql"):
            result = reader.get_online_features(["every_type"], CONSUMERS, store=store)
            assert_expected(result, store)
        # a two-part key: both parts, in the entity's order
        pair = reader.get_online_features(["pair_daily:score"], {"region": ["eu", "us", "eu"], "store_id": [7, 7, 8]}, store="redis")
        assert pair.column("score").values == [1.5, 2.5, None]
        assert pair.column("score").statuses == ["PRESENT", "PRESENT", "NOT_FOUND"]
        assert reader.stats["store_reads"] == 3


def test_async_reader_returns_the_sync_readers_body(written_sample):
    conf, defs = written_sample

    async def read():
        async with AsyncFeatureReader(conf, defs, cache=False) as reader:
            return [(await reader.get_online_features(["every_type"], CONSUMERS, store=s)).to_feast_json() for s in ("redis", "sql")]

    with FeatureReader(conf, defs, cache=False) as reader:
        expected = [reader.get_online_features(["every_type"], CONSUMERS, store=s).to_feast_json() for s in ("redis", "sql")]
    assert asyncio.run(read()) == expected
    body = json.loads(expected[0])
    assert body["metadata"]["feature_names"] == ["consumer_id", *EXPECTED]
    assert body["results"][0] == {"values": [1, 2, 3, 4], "statuses": ["PRESENT"] * 4, "event_timestamps": ["1970-01-01T00:00:00Z"] * 4}
    n = body["results"][3]
    assert n["values"][0] == BIG and b'"values":[1152921504606846977,' in expected[0]  # every digit in the JSON
    assert n["event_timestamps"][0] == f"{DAY + dt.timedelta(days=1)}T00:00:00Z"


def _reader_sessions(pg_server) -> int:
    with pg_server.connect() as admin:
        return admin.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'feature-materializer-reader'").fetchone()[0]


def _reader_sessions_left(pg_server, timeout: float = 10) -> int:
    """The reader's sessions once those closed are gone: a backend leaves pg_stat_activity
    shortly after its client's goodbye, not with it (a busy machine showed one still there)."""
    deadline = time.monotonic() + timeout
    while (left := _reader_sessions(pg_server)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _pooled_settings(conn) -> tuple[str, str]:
    return conn.info.get_parameters().get("keepalives"), conn.execute("SHOW statement_timeout").fetchone()[0]


def test_sql_reads_keep_a_few_connections_made_as_every_store_connection(written_sample, pg_server):
    # sync and asyncio alike: at most reader.sql_connections sessions however many callers,
    # each with the statement timeout (the read's deadline) and TCP keepalives, closed with the reader
    conf, defs = written_sample
    conf = conf.model_copy(update={"reader": conf.reader.model_copy(update={"sql_connections": 2, "single_flight": False})})
    with FeatureReader(conf, defs, cache=False, clock=lambda: AS_OF + 60) as reader:
        results: list = []
        threads = [
            threading.Thread(target=lambda: results.append(reader.get_online_features(["every_type"], CONSUMERS, store="sql")))
            for _ in range(16)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(results) == 16 and reader.stats["store_reads"] == 16
        for result in results:
            assert_expected(result, "sql")
        assert 1 <= _reader_sessions(pg_server) <= 2
        assert _pooled_settings(reader._stores["sql"]._idle.queue[-1]) == ("1", "5s")
    assert _reader_sessions_left(pg_server) == 0

    async def concurrent() -> tuple:
        async with AsyncFeatureReader(conf, defs, cache=False) as reader:
            results = await asyncio.gather(*(reader.get_online_features(["every_type"], CONSUMERS, store="sql") for _ in range(16)))
            sessions = _reader_sessions(pg_server)
            conn = reader._stores["sql"]._idle[-1]
            params = conn.info.get_parameters().get("keepalives"), (await (await conn.execute("SHOW statement_timeout")).fetchone())[0]
            return results, sessions, params

    results, sessions, params = asyncio.run(concurrent())
    for result in results:
        assert_expected(result, "sql")
    assert 1 <= sessions <= 2 and params == ("1", "5s")
    assert _reader_sessions_left(pg_server) == 0


@contextmanager
def _deleted(client: redis.Redis, key: bytes) -> Iterator[None]:
    """``key`` gone from the session's written sample for the block, then back as it was (value and TTL)."""
    raw, ttl = client.dump(key), client.pttl(key)
    assert raw is not None, key
    client.delete(key)
    try:
        yield
    finally:
        client.restore(key, max(ttl, 0), raw, replace=True)
        client.close()


def test_a_redis_miss_is_read_from_sql_for_the_missed_entities_only(written_sample):
    conf, defs = written_sample
    with _deleted(redis.Redis.from_url(conf.redis.url), b"c:1"):
        with FeatureReader(conf, defs, cache=False) as reader:
            result = reader.get_online_features(["every_type:n", "every_type:s"], CONSUMERS)
            assert result.column("n").values == [BIG, None, -5, None]
            assert result.column("n").statuses == ["PRESENT", "NULL_VALUE", "PRESENT", "NOT_FOUND"]
            # Redis for all four, then SQL for the two it did not hold (1, deleted, and 4)
            assert reader.stats["store_reads"] == 2 and reader.stats["entities_read"] == 4 + 2
        off = conf.model_copy(update={"reader": ReaderSettings(read_through=False, timeout_ms=5000)})
        with FeatureReader(off, defs, cache=False) as reader:
            statuses = reader.get_online_features(["every_type:n"], CONSUMERS).column("n").statuses
            assert statuses == ["NOT_FOUND", "NULL_VALUE", "PRESENT", "NOT_FOUND"]


def test_values_older_than_max_age_are_withheld(written_sample):
    conf, defs = written_sample
    with FeatureReader(conf, defs, cache=False, clock=lambda: AS_OF + 7200) as reader:
        pair = reader.get_online_features(["pair_daily:score"], {"region": ["eu"], "store_id": [7]})
        assert (pair.column("score").values, pair.column("score").statuses) == ([None], ["OUTSIDE_MAX_AGE"])  # the source's 3600 s
        fresh = reader.get_online_features(["every_type:n"], CONSUMERS)  # no max_age of its own
        assert fresh.column("n").statuses[0] == "PRESENT"
        old = reader.get_online_features(["every_type:n"], CONSUMERS, max_age=3600)  # the request's
        assert old.column("n").statuses == ["OUTSIDE_MAX_AGE", "OUTSIDE_MAX_AGE", "OUTSIDE_MAX_AGE", "NOT_FOUND"]
        assert old.column("n").values == [None] * 4
    with FeatureReader(conf, defs, cache=False, clock=lambda: AS_OF + 60) as reader:
        assert reader.get_online_features(["pair_daily:score"], {"region": ["eu"], "store_id": [7]}).column("score").values == [1.5]


def test_feature_service_and_the_get_command(written_sample, tmp_path, monkeypatch, capsys):
    from jobs.cli import main

    from .support.confs import env_conf

    conf, defs = written_sample
    with FeatureReader(conf, defs, cache=False, clock=lambda: AS_OF + 60) as reader:
        both = reader.get_online_features(feature_service="ranking", entities={"consumer_id": [1], "region": ["us"], "store_id": [7]})
        assert [c.name for c in both.columns] == ["n", "score"] and both.to_dict()["score"] == [2.5]
        expected = reader.get_online_features(["every_type:n", "every_type:e"], {"consumer_id": [1, 4]}, store="sql").to_feast_json()
    settings = json.dumps({
        "definitions_dir": conf.definitions_dir, "sinks": ["redis", "sql"],
        "redis": {"url": conf.redis.url, "password_env": None, "mode": "standalone"}, "sql": {"dsn": conf.sql.dsn, "password_env": None},
    })  # fmt: skip
    monkeypatch.setenv("FM_CONF_DIR", str(env_conf(tmp_path / "conf", "t", settings)))
    (tmp_path / "req.json").write_text(json.dumps({"features": ["every_type:n", "every_type:e"], "entities": {"consumer_id": [1, 4]}}))
    assert main(["get", "--env", "t", "--request", str(tmp_path / "req.json"), "--store", "sql"]) == 0
    printed = capsys.readouterr().out.encode()
    assert printed == expected + b"\n"
    n, e = json.loads(printed)["results"][1:]
    assert (n["values"], n["statuses"]) == ([BIG, None], ["PRESENT", "NOT_FOUND"])
    assert e["values"][0] == [float(np.float32(v)) for v in (0.5, -1.25, 3.0, 0.1)] and e["statuses"] == ["PRESENT", "NOT_FOUND"]
    (tmp_path / "bad.json").write_text(json.dumps({"features": ["every_type:nn"], "entities": {"consumer_id": [1]}}))
    assert main(["get", "--env", "t", "--request", str(tmp_path / "bad.json")]) == 2
    assert "unknown feature of source 'every_type': 'nn'; did you mean 'n'?" in capsys.readouterr().err


# ---- requests refused, without any store --------------------------------------------------


@pytest.fixture(scope="module")
def sample_defs():
    return load_definitions(DEFAULT_DIR)


@pytest.mark.parametrize(
    "features, entities, error, text",
    [
        (
            ["consumer_dayly:orders_7d"],
            {"consumer_id": [1]},
            UnknownNameError,
            "unknown source 'consumer_dayly'; did you mean 'consumer_daily'?",
        ),
        (["consumer_daily:orders_7"], {"consumer_id": [1]}, UnknownNameError, "did you mean 'orders_7d', 'orders_30d'?"),
        (["consumer_daily:orders_7d"], {"consumer": [1]}, EntityKeyError, "unknown entity key(s) 'consumer'; missing 'consumer_id'"),
        (
            ["consumer_daily:orders_7d"],
            {"consumer_id": ["1"]},
            EntityKeyError,
            "entity key 'consumer_id' row 0: expected an integer, got str",
        ),
        (["consumer_daily:orders_7d"], {"consumer_id": [True]}, EntityKeyError, "expected an integer, got bool"),
        (["store_features_long:is_open_late"], {"store_id": ["a:b"]}, EntityKeyError, "no ':' or control characters"),
        (
            ["consumer_daily:orders_7d"],
            {"consumer_id": list(range(1001))},
            RequestError,
            "1,001 entities in one request; the limit is 1,000",
        ),
        ([], {"consumer_id": [1]}, RequestError, "no features requested"),
    ],
)
def test_bad_requests_name_the_bad_part(sample_defs, features, entities, error, text):
    reader = FeatureReader(reader_conf("redis://127.0.0.1:1/0"), sample_defs)  # never connects: refused before any read
    with pytest.raises(error) as caught:
        reader.get_online_features(features, entities)
    assert text in str(caught.value)


# ---- single-flight, early refresh, stale-if-error: counted on the server -------------------


@pytest.fixture
def hot_key(tmp_path, sample_defs):
    """A Redis of its own holding consumer 1 of consumer_daily (orders_7d = 7)."""
    server = start_redis(tmp_path / "r")
    client = server.client()
    client.hset(b"c:1", mapping={freshness_field("consumer_daily"): str(AS_OF).encode(), field_id("orders_7d"): encode("int", 7)})
    client.config_resetstat()
    yield server
    server.stop()


async def described(reader: AsyncFeatureReader, server) -> None:
    """What Redis holds, read before the reads a test counts (its HMGETs are not theirs)."""
    await reader.describe()
    server.client().config_resetstat()


def hmget_calls(server) -> int:
    return int(server.client().info("commandstats").get("cmdstat_hmget", {}).get("calls", 0))


def test_a_thousand_concurrent_async_reads_of_a_cold_key_read_redis_once(hot_key, sample_defs):
    async def burst():
        async with AsyncFeatureReader(reader_conf(hot_key.url), sample_defs) as reader:
            await described(reader, hot_key)
            hot_key.client().execute_command("CLIENT", "PAUSE", "300", "ALL")  # the first read waits: every other arrives meanwhile
            results = await asyncio.gather(
                *[reader.get_online_features(["consumer_daily:orders_7d"], {"consumer_id": [1]}) for _ in range(1000)]
            )
            return results, reader.stats, len(reader._flights)

    results, stats, pending = asyncio.run(burst())
    assert {tuple(r.column("orders_7d").values) for r in results} == {(7,)}
    assert hmget_calls(hot_key) == 1
    assert stats["coalesced"] == 999 and stats["store_reads"] == 1 and pending == 0


def test_without_the_cache_a_read_of_other_features_is_not_coalesced(hot_key, sample_defs):
    async def two():
        async with AsyncFeatureReader(reader_conf(hot_key.url), sample_defs, cache=False) as reader:
            await described(reader, hot_key)
            hot_key.client().execute_command("CLIENT", "PAUSE", "300", "ALL")
            ask = lambda name: reader.get_online_features([f"consumer_daily:{name}"], {"consumer_id": [1]})  # noqa: E731
            return await asyncio.gather(ask("orders_30d"), ask("orders_7d"))  # the first reads orders_30d only

    thirty, seven = asyncio.run(two())
    assert thirty.column("orders_30d").statuses == ["NULL_VALUE"]
    assert (seven.column("orders_7d").values, seven.column("orders_7d").statuses) == ([7], ["PRESENT"])
    assert hmget_calls(hot_key) == 2


def test_sixty_four_threads_reading_a_cold_key_read_redis_once(hot_key, sample_defs):
    reader = FeatureReader(reader_conf(hot_key.url), sample_defs)
    reader.describe()  # what Redis holds, read before the threads (its HMGETs are not the reads counted)
    hot_key.client().config_resetstat()
    start = threading.Barrier(64)
    values = []

    def one():
        start.wait()
        values.append(reader.get_online_features(["consumer_daily:orders_7d"], {"consumer_id": [1]}).column("orders_7d").values)

    hot_key.client().execute_command("CLIENT", "PAUSE", "300", "ALL")
    threads = [threading.Thread(target=one) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert values == [[7]] * 64 and hmget_calls(hot_key) == 1
    assert reader.stats["coalesced"] + reader.stats["hits"] == 63 and len(reader._flights) == 0
    reader.close()


def test_an_early_refresh_rereads_a_hot_key_once_before_it_expires(hot_key, sample_defs):
    now = [1000.0]

    async def run():
        async with AsyncFeatureReader(reader_conf(hot_key.url, jitter=0, early_refresh_beta=1e6), sample_defs) as reader:
            await described(reader, hot_key)
            reader.cache.clock, reader.cache.rng = (lambda: now[0]), (lambda: 0.5)
            ask = lambda: reader.get_online_features(["consumer_daily:orders_7d"], {"consumer_id": [1]})  # noqa: E731
            await ask()  # cached until 1060
            hot_key.client().hset(b"c:1", field_id("orders_7d"), b"8")
            now[0] = 1059.0  # within XFetch's window: one caller refreshes, the others are answered from the cache
            answers = await asyncio.gather(*[ask() for _ in range(100)])
            calls = hmget_calls(hot_key)
            now[0] = 1061.0  # past the old expiry: the refreshed entry answers
            reader.cache.settings = reader.cache.settings.model_copy(update={"early_refresh_beta": 0})
            last = await ask()
            return answers, calls, last, reader.stats

    answers, calls, last, stats = asyncio.run(run())
    assert calls == 2 and hmget_calls(hot_key) == 2  # the first read and one refresh
    assert {a.column("orders_7d").values[0] for a in answers} == {7}  # answered from the cache meanwhile
    assert last.column("orders_7d").values == [8] and stats["misses"] == 1 and stats["early_refreshes"] == 1


def test_stale_values_answer_while_redis_is_down_then_fail(hot_key, sample_defs):
    reader = FeatureReader(reader_conf(hot_key.url, ttl_seconds=0.05, jitter=0, stale_if_error_seconds=1.0), sample_defs)
    ask = lambda: reader.get_online_features(["consumer_daily:orders_7d"], {"consumer_id": [1]})  # noqa: E731
    assert ask().column("orders_7d").statuses == ["PRESENT"]
    hot_key.stop()
    time.sleep(0.1)
    stale = ask().column("orders_7d")
    assert (stale.values, stale.statuses) == ([7], ["STALE"]) and reader.stats["stale_served"] == 1
    time.sleep(1.0)
    with pytest.raises(StoreError, match="Redis at redis://127.0.0.1"):
        ask()
    assert len(reader._flights) == 0


def test_thousands_of_failed_reads_leave_nothing_on_the_scoreboard(tmp_path, sample_defs):
    server = start_redis(tmp_path / "gone")
    url = server.url
    server.stop()

    async def burst():
        async with AsyncFeatureReader(reader_conf(url), sample_defs) as reader:
            outcomes = await asyncio.gather(
                *[reader.get_online_features(["consumer_daily:orders_7d"], {"consumer_id": [i % 50]}) for i in range(3000)],
                return_exceptions=True,
            )
            return outcomes, len(reader._flights)

    outcomes, pending = asyncio.run(burst())
    assert all(isinstance(o, StoreError) for o in outcomes) and pending == 0
    reader = FeatureReader(reader_conf(url), sample_defs)
    errors = []

    def many():
        for i in range(100):
            try:
                reader.get_online_features(["consumer_daily:orders_7d"], {"consumer_id": [i % 5]})
            except StoreError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=many) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 1600 and len(reader._flights) == 0


def test_a_value_that_does_not_decode_is_marked_and_the_rest_served(hot_key, sample_defs):
    hot_key.client().hset(b"c:1", mapping={field_id("orders_30d"): b"12x", field_id("churn_score"): b"0.5"})
    reader = FeatureReader(reader_conf(hot_key.url), sample_defs, cache=False)
    result = reader.get_online_features(
        ["consumer_daily:orders_7d", "consumer_daily:orders_30d", "consumer_daily:churn_score"], {"consumer_id": [1]}
    )
    assert [c.statuses[0] for c in result.columns] == ["PRESENT", "INVALID", "PRESENT"]
    assert [c.values[0] for c in result.columns] == [7, None, 0.5] and reader.stats["decode_errors"] == 1


def test_a_key_that_is_not_a_hash_fails_its_batch_and_leaves_the_connection_clean(hot_key, sample_defs):
    """WRONGTYPE in the middle of a batch: the batch fails naming the server, every reply is
    read off the connection, and the next batch on it gets its own replies."""
    hot_key.client().set(b"c:2", b"not a hash")
    ask = ["consumer_daily:orders_7d"]

    async def read_async():
        async with AsyncFeatureReader(reader_conf(hot_key.url), sample_defs, cache=False) as reader:
            with pytest.raises(StoreError, match=f"127.0.0.1:{hot_key.port}.*WRONGTYPE"):
                await reader.get_online_features(ask, {"consumer_id": [1, 2, 3]})
            return (await reader.get_online_features(ask, {"consumer_id": [3, 1]})).column("orders_7d").values

    with FeatureReader(reader_conf(hot_key.url), sample_defs, cache=False) as reader:
        with pytest.raises(StoreError, match=f"127.0.0.1:{hot_key.port}.*WRONGTYPE"):
            reader.get_online_features(ask, {"consumer_id": [1, 2, 3]})
        assert reader.get_online_features(ask, {"consumer_id": [3, 1]}).column("orders_7d").values == [None, 7]
    assert asyncio.run(read_async()) == [None, 7]


def _reader_clients(server) -> list[dict]:
    """The server's connections whose last command was HMGET: the reader's (CLIENT LIST, parsed)."""
    rows = server.client().execute_command("CLIENT", "LIST")
    rows = rows.decode() if isinstance(rows, bytes) else rows
    clients = [dict(f.split("=", 1) for f in line.split(" ") if "=" in f) for line in rows.splitlines() if line]
    return [c for c in clients if c.get("cmd") == "hmget"]


@pytest.fixture
def numbered(tmp_path):
    """A Redis of its own holding consumers 0..299 of consumer_daily, orders_7d = the id."""
    server = start_redis(tmp_path / "n")
    client = server.client()
    for i in range(300):
        client.hset(
            f"c:{i}".encode(), mapping={freshness_field("consumer_daily"): str(AS_OF).encode(), field_id("orders_7d"): encode("int", i)}
        )
    yield server
    server.stop()


def _timeout_conf(url: str, ms: float, **reader) -> RunConf:
    conf = reader_conf(url)
    return conf.model_copy(update={"reader": conf.reader.model_copy(update={"timeout_ms": ms, **reader})})


def _orders(reader):
    """orders_7d of the consumer ids given, read by ``reader`` (a coroutine per call)."""
    return lambda ids: reader.get_online_features(["consumer_daily:orders_7d"], {"consumer_id": ids})


def test_concurrent_async_reads_share_one_connection_each_getting_its_own_replies(numbered, sample_defs):
    async def burst():
        async with AsyncFeatureReader(reader_conf(numbered.url), sample_defs, cache=False) as reader:
            await described(reader, numbered)
            ids = [[i] for i in range(300)] + [[299 - i, i, 7] for i in range(100)]  # single reads and batches, interleaved
            results = await asyncio.gather(*map(_orders(reader), ids))
            return ids, results, _reader_clients(numbered)

    ids, results, clients = asyncio.run(burst())
    assert [r.column("orders_7d").values for r in results] == ids
    assert len(clients) == 1  # the reader's one connection: 400 reads went over it
    assert int(numbered.client().info("commandstats")["cmdstat_hmget"]["calls"]) == 300  # a key read by reads at once: once


def test_a_read_given_up_leaves_the_connection_in_step(numbered, sample_defs):
    """A caller cancelled after its HMGET went out: its replies arrive later and are dropped;
    the next read on the same connection gets its own."""

    async def run():
        async with AsyncFeatureReader(reader_conf(numbered.url), sample_defs, cache=False) as reader:
            ask = _orders(reader)
            await ask([0])  # connected
            first = _reader_clients(numbered)
            numbered.client().execute_command("CLIENT", "PAUSE", "200", "ALL")
            given_up = asyncio.create_task(ask([1, 2, 3]))
            await asyncio.sleep(0.05)  # sent, its replies held by the pause
            given_up.cancel()
            after = await ask([250, 9])
            return first, after.column("orders_7d").values, _reader_clients(numbered), given_up.cancelled()

    first, values, clients, cancelled = asyncio.run(run())
    assert cancelled and values == [250, 9]
    assert [c["id"] for c in clients] == [c["id"] for c in first]  # the same connection, not a new one


def test_a_read_past_its_deadline_fails_and_the_next_one_reconnects(numbered, sample_defs):
    """Redis sends nothing for the whole timeout: the reads waiting fail with ReadTimeout, the
    connection is dropped (replies may still be due on it), the next read opens another."""
    conf = _timeout_conf(numbered.url, 150)

    async def run():
        async with AsyncFeatureReader(conf, sample_defs, cache=False) as reader:
            ask = _orders(reader)
            await ask([0])
            first = _reader_clients(numbered)
            numbered.client().execute_command("CLIENT", "PAUSE", "400", "ALL")
            started = time.monotonic()
            outcomes = await asyncio.gather(ask([1]), ask([2, 3]), return_exceptions=True)
            waited = time.monotonic() - started
            await asyncio.sleep(0.4)  # the pause ends
            after = await ask([4, 5])
            return first, outcomes, waited, after.column("orders_7d").values, _reader_clients(numbered)

    first, outcomes, waited, values, clients = asyncio.run(run())
    assert all(isinstance(o, StoreError) and "did not answer in 150 ms" in str(o) for o in outcomes), outcomes
    assert 0.14 <= waited < 0.35
    assert values == [4, 5] and len(clients) == 1 and clients[0]["id"] != first[0]["id"]


def test_a_connection_gone_silent_after_replies_is_dropped(numbered, sample_defs):
    """Redis stops (SIGSTOP) after answering one read while another, sent later, waits: the
    bytes that came after that read went out do not keep the connection alive."""
    import os
    import signal

    conf = _timeout_conf(numbered.url, 150)

    async def run():
        async with AsyncFeatureReader(conf, sample_defs, cache=False) as reader:
            ask = _orders(reader)
            await ask([0])
            (first,) = _reader_clients(numbered)
            answered = asyncio.create_task(ask([1]))
            await asyncio.sleep(0)
            await asyncio.sleep(0)  # its HMGET written
            time.sleep(0.05)  # the loop held: Redis answers it; the reply waits in the socket
            os.kill(numbered.process.pid, signal.SIGSTOP)
            try:
                unanswered = asyncio.create_task(ask([2]))
                await asyncio.sleep(0)
                await asyncio.sleep(0)  # written to a stopped server; then the first reply is read
                got = (await answered).column("orders_7d").values
                with pytest.raises(StoreError, match="did not answer in 150 ms"):
                    await unanswered
                await asyncio.sleep(0.2)  # silent for the timeout since the last bytes: dropped
            finally:
                os.kill(numbered.process.pid, signal.SIGCONT)
            after = (await ask([4, 5])).column("orders_7d").values
            return got, first, after, _reader_clients(numbered)

    got, first, after, clients = asyncio.run(run())
    assert got == [1] and after == [4, 5]
    assert first["id"] not in {c["id"] for c in clients}  # the silent connection was closed


def test_a_read_waiting_for_a_slot_waits_within_its_timeout(numbered, sample_defs):
    """One read at a time (reader.redis_connections 1), Redis paused: the second read fails
    at its own timeout while it waits for the slot, not once the first has failed and it
    has tried a connection of its own (a timeout more)."""

    async def run():
        async with AsyncFeatureReader(_timeout_conf(numbered.url, 300, redis_connections=1), sample_defs, cache=False) as reader:
            ask = _orders(reader)
            await ask([0])
            numbered.client().execute_command("CLIENT", "PAUSE", "1500", "ALL")
            first = asyncio.create_task(ask([1]))
            await asyncio.sleep(0)  # it holds the slot
            started = time.monotonic()
            with pytest.raises(StoreError, match="did not answer in 300 ms"):
                await ask([2])
            waited = time.monotonic() - started
            with pytest.raises(StoreError):
                await first
            return waited

    assert 0.28 <= asyncio.run(run()) < 0.45


def test_a_connection_killed_between_reads_is_replaced_unnoticed(numbered, sample_defs):
    async def run():
        async with AsyncFeatureReader(reader_conf(numbered.url), sample_defs, cache=False) as reader:
            ask = _orders(reader)
            await ask([0])
            (first,) = _reader_clients(numbered)
            killed = numbered.client().execute_command("CLIENT", "KILL", "ID", first["id"])
            await asyncio.sleep(0.05)  # the loop sees the connection close
            values = (await ask([6, 7])).column("orders_7d").values
            return killed, values, first, _reader_clients(numbered), reader.stats["errors"]

    killed, values, first, clients, errors = asyncio.run(run())
    assert killed == 1 and values == [6, 7] and errors == 0
    assert len(clients) == 1 and clients[0]["id"] != first["id"]


@pytest.mark.parametrize(
    "kind, options, raws",
    [
        ("float", {}, [b"1e308", b"1e308", b"0.5", None]),  # finite values whose sum would overflow
        ("float", {}, [b"1e999", b"+5", b"nan", b"1_0", b"2"]),
        ("float", {"precision": "float32"}, [b"3.4028235e+38", b"3.5e+38", b"0.1"]),
        ("int", {}, [b"+5", b"1-2", b"9223372036854775808", b"-9223372036854775808", b"007", b" 1"]),
        ("bool", {}, [b"1", b"0", b"2", b""]),
        ("string", {}, [b"caf\xc3\xa9", b"\xff", b""]),
        (
            "embedding",
            {"dimension": 2},
            [encode("embedding", [0.5, -1.0], dimension=2), b"\x0a\x08" + b"\x00\x00\xc0\x7f" * 2, b"\x0a\x04\x00\x00\x00\x00"],
        ),
        # more than decode.SMALL values: the one-matrix paths, one bad value among them
        ("embedding", {"dimension": 2}, [encode("embedding", [float(i), -0.5], dimension=2) for i in range(12)] + [None]),
        (
            "embedding",
            {"dimension": 2},
            [encode("embedding", [float(i), -0.5], dimension=2) for i in range(12)] + [b"\x0a\x08" + b"\x00\x00\xc0\x7f" * 2],
        ),
        ("int_list", {}, [encode("int_list", [i, 127, 0, 5]) for i in range(12)] + [None]),
        (
            "int_list",
            {},
            [encode("int_list", [i, 127, 0, 5]) for i in range(12)] + [encode("int_list", [1, 128, 2, 3])],
        ),  # same length, a two-byte varint
        ("int_list", {}, [encode("int_list", [i, 1]) for i in range(12)] + [b"\x06\x14\x0a\x04\x01\x02\x03\xff"]),  # a bad message
        (
            "int_list",
            {},
            [encode("int_list", []), encode("int_list", [3]), encode("int_list", [-1]), encode("int_list", [300, 1]), b"\x00\x01", b"junk"],
        ),
        (
            "int_list",
            {"compression": "none"},
            [encode("int_list", [1, 2], compression="none"), b"", encode("int_list", [200], compression="none"), b"\x0a\x05\x01"],
        ),
    ],
)
def test_the_column_decoder_agrees_with_the_reference_value_by_value(kind, options, raws):
    from feature_defs import FeatureDef
    from feature_reader.decode import BAD, decode_column
    from serializers import DecodeError, decode

    feature = FeatureDef(name="x", type=kind, **options)
    expected = []
    for raw in raws:
        try:
            expected.append(None if raw is None else decode(kind, raw, **feature.options))
        except DecodeError:
            expected.append(BAD)
    got = decode_column(feature, raws, as_list=True)
    assert got == expected


def test_the_grouped_decoder_equals_the_column_decoder_and_names_its_holes():
    """Float and int columns decoded together, as decode_column decodes each; a corrupt value
    sends only its own column the slow way; the columns that may hold None or BAD are named."""
    from feature_defs import FeatureDef
    from feature_reader.decode import BAD, ColumnDecoder, decode_column

    feats = [FeatureDef(name=f"f{j}", type="float") for j in range(3)] + [
        FeatureDef(name="n", type="int"),
        FeatureDef(name="b", type="bool"),
    ]
    clean = [(b"0.5", b"1", b"-2.25", b"7", b"1"), (b"0", b"1e-3", b"3", b"-8", b"0")]
    corrupt = clean + [(b"0.25", b"1x", b"4", b"9", b"1")]
    holed = clean + [(b"0.25", None, b"4", b"9", b"1")]
    for rows, holey in ((clean, [4]), (corrupt, [0, 1, 2, 4]), (holed, [0, 1, 2, 4])):
        columns = [list(c) for c in zip(*rows)]
        got, named = ColumnDecoder(feats).decode(columns)
        assert got == [decode_column(f, c) for f, c in zip(feats, columns)]
        assert named == holey  # the bool column is decoded alone: always named
    got, _ = ColumnDecoder(feats).decode([list(c) for c in zip(*corrupt)])
    assert got[1] == [1.0, 0.001, BAD] and got[0] == [0.5, 0.0, 0.25]


def test_one_entity_is_decoded_as_a_row_equal_to_the_column_decoder():
    """The one-entity path (a miss's common case) gives fixed expected values (the embedding
    as the writer's bytes of FORMAT.md) and calls a row complete only when no value is None or BAD."""
    import numpy as np

    from feature_defs import FeatureDef
    from feature_reader.decode import BAD, ColumnDecoder

    feats = [
        FeatureDef(name="f0", type="float"),
        FeatureDef(name="f1", type="float"),
        FeatureDef(name="n", type="int"),
        FeatureDef(name="e", type="embedding", dimension=3),
    ]
    emb = b"\x0a\x0c" + np.array([0.5, -1.0, 2.0], "<f4").tobytes()  # tag 1, 12 bytes of packed float32
    for raw, expected, complete in (
        ([b"0.5", b"-2", b"12", emb], [0.5, -2.0, 12, [0.5, -1.0, 2.0]], True),
        ([b"0.5", None, b"12", emb], [0.5, None, 12, [0.5, -1.0, 2.0]], False),  # not stored: NULL_VALUE
        ([b"0.5", b"1x", b"12", emb], [0.5, BAD, 12, [0.5, -1.0, 2.0]], False),  # corrupt: the group goes the slow way, only it is BAD
        ([b"0.5", b"-2", b"12", emb[:-1]], [0.5, -2.0, 12, BAD], False),  # a truncated embedding
    ):
        values, whole = ColumnDecoder(feats).decode_row(raw)
        assert whole is complete
        assert values[:3] == expected[:3]
        assert values[3] is BAD if expected[3] is BAD else values[3].tolist() == expected[3]


def test_a_row_whose_floats_are_not_side_by_side_decodes_each_in_its_place():
    """Groups in consecutive positions are decoded as one slice; interleaved ones value by value: both give the fixed values."""
    from feature_defs import FeatureDef
    from feature_reader.decode import BAD, ColumnDecoder

    feats = [
        FeatureDef(name="f0", type="float"),
        FeatureDef(name="n", type="int"),
        FeatureDef(name="f1", type="float"),
        FeatureDef(name="m", type="int"),
    ]
    assert ColumnDecoder(feats).decode_row([b"0.5", b"7", b"-2", b"9"]) == ([0.5, 7, -2.0, 9], True)
    assert ColumnDecoder(feats).decode_row([b"0.5", b"7", b"x", None]) == ([0.5, 7, BAD, None], False)
    side_by_side = [feats[0], feats[2], feats[1], feats[3]]
    assert ColumnDecoder(side_by_side).decode_row([b"0.5", b"-2", b"7", b"9"]) == ([0.5, -2.0, 7, 9], True)
