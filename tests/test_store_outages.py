"""Stores failing never take the read side down: a reader and `materialize serve` start
while Redis is down and recover when it is back; a failed Redis read of a source the SQL
store holds too is answered from SQL; a store's circuit breaker stops a dead store from
costing every request its timeout; a connect is not a read's deadline, and connections
are opened ahead of the reads; /health asks the reader's own connections, not new ones.

Redis and PostgreSQL hold different values for the same entities here (Redis 1000 + id,
SQL the id), so every answer says which store gave it.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from feature_defs import DEFAULT_DIR, load_definitions
from feature_reader import AsyncFeatureReader, FeatureReader, StoreError, StoreUnavailable
from feature_reader.breaker import CLOSED, HALF_OPEN, OPEN, Breaker
from fm_config import RunConf
from fm_config.reader import CacheSettings, ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from serializers import encode, field_id, freshness_field
from sinks.sql.statements import create_table
from throwaway.servers import start_redis

from .support.every_type import AS_OF
from .support.serving import serve

ASK = ["consumer_daily:orders_7d"]


@pytest.fixture(scope="module")
def defs():
    return load_definitions(DEFAULT_DIR)


def _write_redis(client, ids) -> None:
    for i in ids:
        client.hset(
            f"c:{i}".encode(),
            mapping={freshness_field("consumer_daily"): str(AS_OF).encode(), field_id("orders_7d"): encode("int", 1000 + i)},
        )


def _write_sql(conn: psycopg.Connection, ids) -> None:
    table = sql.Identifier("consumer_features")
    conn.execute(create_table(table, "postgres"))
    for i in ids:
        conn.execute(
            sql.SQL("INSERT INTO {} VALUES (%s, 'consumer_daily', %s::jsonb, to_timestamp(%s))").format(table),
            (str(i), json.dumps({"orders_7d": i}), AS_OF),
        )


def _conf(redis_url: str, dsn: str | None, mode: str = "auto", **reader) -> RunConf:
    return RunConf(
        env="test", sinks=["redis", "sql"] if dsn else ["redis"],
        redis=RedisSettings(url=redis_url, password_env=None, mode=mode),
        sql=SqlSettings(dsn=dsn or "postgresql://nobody@127.0.0.1:1/none", password_env=None),
        reader=ReaderSettings(**{"timeout_ms": 5000, "cache": CacheSettings(enabled=False), **reader}),
    )  # fmt: skip


def _values(result) -> list:
    column = result.column("orders_7d")
    assert set(column.statuses) == {"PRESENT"}, column.statuses
    return column.values


def _until(check, seconds: float = 30.0):
    """``check()`` until it returns something true (generous: the machine may be busy)."""
    deadline = time.monotonic() + seconds
    while True:
        got = check()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _connections(admin) -> set[str]:
    """Ids of the server's client connections other than ``admin``'s (CLIENT LIST, parsed)."""
    rows = admin.execute_command("CLIENT", "LIST").decode()
    ids = {dict(f.split("=", 1) for f in line.split(" ") if "=" in f)["id"] for line in rows.splitlines() if line}
    return ids - {str(admin.client_id())}


# ---- the breaker's states ----------------------------------------------------------------


def test_the_breaker_opens_after_n_failures_in_a_row_lets_one_probe_through_and_closes_on_success():
    now = [0.0]
    breaker = Breaker("Redis at redis://h:1/0", failures=3, cooldown=2.0, clock=lambda: now[0])
    for _ in range(2):
        breaker.allow()
        assert breaker.failed_call(OSError("refused")) is False
    breaker.allow()
    breaker.succeeded()  # a success between failures: the count starts again
    assert [breaker.failed_call(OSError("refused")) for _ in range(3)] == [False, False, True]
    assert (breaker.state, breaker.opens) == (OPEN, 1)
    now[0] = 1.9
    skipped = r"Redis at redis://h:1/0 skipped: 3 calls in a row failed \(last: refused\); next try in 0.1 s"
    with pytest.raises(StoreUnavailable, match=skipped):
        breaker.allow()
    now[0] = 2.0
    breaker.allow()  # the probe
    assert breaker.state == HALF_OPEN
    with pytest.raises(StoreUnavailable):
        breaker.allow()  # the others, while it is out
    assert breaker.failed_call(OSError("still refused")) is True  # a failed probe: open again, a new cool-down
    assert (breaker.state, breaker.opens) == (OPEN, 2)
    now[0] = 3.0
    with pytest.raises(StoreUnavailable):
        breaker.allow()
    now[0] = 4.0
    breaker.allow()
    breaker.succeeded()
    assert (breaker.state, breaker.failed) == (CLOSED, 0)
    breaker.allow()


# ---- the reader ---------------------------------------------------------------------------


def test_a_reader_made_while_redis_is_down_reads_sql_and_redis_once_it_is_back(tmp_path, pg_server, pg_db, defs):
    gone = start_redis(tmp_path / "r")
    port = gone.port
    gone.stop()
    _write_sql(pg_db, range(10))
    conf = _conf(f"redis://127.0.0.1:{port}/0", pg_server.dsn, breaker_failures=3, breaker_cooldown_ms=600_000)
    with FeatureReader(conf, defs) as reader:  # redis.mode auto: decided on the first contact, not here
        answers = [_values(reader.get_online_features(ASK, {"consumer_id": [i, i + 1]})) for i in range(8)]
        assert answers == [[i, i + 1] for i in range(8)]  # every one from SQL
        stats = reader.stats
        # three calls failed and opened the breaker; the other five were not made
        assert (stats["fallbacks"], stats["breaker_opens"], stats["breaker_skips"]) == (8, 1, 5)
        assert reader.breaker_states == {"redis": OPEN, "sql": CLOSED}
        health = reader.ping()
        assert health["sql"] == "ok" and f"127.0.0.1:{port}" in health["redis"]
        back = start_redis(tmp_path / "r2", port=port)
        try:
            _write_redis(back.client(), range(10))
            assert reader.ping() == {"redis": "ok", "sql": "ok"}  # an answer closes the breaker
            assert _values(reader.get_online_features(ASK, {"consumer_id": [3, 4]})) == [1003, 1004]
            assert reader.breaker_states["redis"] == CLOSED and reader.stats["fallbacks"] == 8
        finally:
            back.stop()


def test_a_paused_redis_fails_over_to_sql_and_its_breaker_stops_the_waiting(tmp_path, pg_server, pg_db, defs):
    """SIGSTOP: connects hang and reads time out (the worst kind of dead). After
    breaker_failures timed-out calls no request waits for Redis; once Redis answers again
    (and its breaker's cool-down has passed) Redis serves."""
    own = start_redis(tmp_path / "p")
    _write_redis(own.client(), range(40))
    _write_sql(pg_db, range(40))
    conf = _conf(
        own.url, pg_server.dsn, "standalone", timeout_ms=300, connect_timeout_ms=500, breaker_failures=3, breaker_cooldown_ms=600_000
    )

    async def run():
        async with AsyncFeatureReader(conf, defs) as reader:
            ask = lambda ids: reader.get_online_features(ASK, {"consumer_id": ids})  # noqa: E731
            first = _values(await ask([0]))
            os.kill(own.process.pid, signal.SIGSTOP)
            try:
                during = [_values(await ask([i])) for i in range(1, 31)]
                stats, states = reader.stats, reader.breaker_states
            finally:
                os.kill(own.process.pid, signal.SIGCONT)
            reader.breakers["redis"].cooldown = 0.0  # the cool-down over: the next call probes Redis
            deadline = time.monotonic() + 30
            after = _values(await ask([35]))
            while after != [1035] and time.monotonic() < deadline:  # the probe may meet a connect still hanging
                await asyncio.sleep(0.1)
                after = _values(await ask([35]))
            return first, during, stats, states, after, reader.breaker_states

    try:
        first, during, stats, states, after, states_after = asyncio.run(run())
    finally:
        own.stop()  # a paused server left behind outlives the suite
    assert first == [1000] and during == [[i] for i in range(1, 31)]
    assert (stats["fallbacks"], stats["breaker_opens"], stats["breaker_skips"]) == (30, 1, 27)
    assert states["redis"] == OPEN and after == [1035] and states_after["redis"] == CLOSED


def test_without_fallback_a_failed_redis_read_fails(tmp_path, pg_server, pg_db, defs):
    gone = start_redis(tmp_path / "r")
    url = gone.url
    gone.stop()
    _write_sql(pg_db, range(3))
    with FeatureReader(_conf(url, pg_server.dsn, "standalone", fallback=False, read_through=False), defs) as reader:
        with pytest.raises(StoreError, match=f"Redis at {url.rsplit('/', 1)[0]}"):
            reader.get_online_features(ASK, {"consumer_id": [1]})
        assert reader.stats["fallbacks"] == 0
        # the source's stores asked by name still answer
        assert _values(reader.get_online_features(ASK, {"consumer_id": [1]}, store="sql")) == [1]


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_a_connect_is_not_counted_against_a_reads_deadline(tmp_path, defs, kind):
    """Redis paused while the reader connects (its handshake waits for a second), with a
    read deadline of 300 ms: the read waits for the connect (reader.connect_timeout_ms), then
    answers within its own deadline."""
    own = start_redis(tmp_path / "c")
    _write_redis(own.client(), [7])
    conf = _conf(own.url, None, "standalone", timeout_ms=300, connect_timeout_ms=30_000)
    os.kill(own.process.pid, signal.SIGSTOP)
    threading.Timer(1.0, os.kill, (own.process.pid, signal.SIGCONT)).start()
    try:
        if kind == "threads":
            with FeatureReader(conf, defs) as reader:
                got = _values(reader.get_online_features(ASK, {"consumer_id": [7]}))
        else:

            async def run():
                async with AsyncFeatureReader(conf, defs) as reader:
                    return _values(await reader.get_online_features(ASK, {"consumer_id": [7]}))

            got = asyncio.run(run())
        assert got == [1007]
    finally:
        time.sleep(1.0)
        os.kill(own.process.pid, signal.SIGCONT)
        own.stop()


@pytest.mark.parametrize("kind", ["threads", "asyncio"])
def test_connections_open_before_the_first_read_and_again_after_a_drop(tmp_path, defs, kind):
    own = start_redis(tmp_path / "w")
    admin = own.client()
    conf = _conf(own.url, None, "standalone")
    others = _connections(admin)  # e.g. start_redis's own check, not yet collected

    def watch(reader) -> tuple[list, list]:
        if kind == "asyncio":  # it also reads what Redis holds at start, on a connection of its own, closed after
            _until(lambda: reader._core.verdicts.known("redis"))
            _until(lambda: len(_connections(admin) - others) == 1)
        opened = sorted(_until(lambda: _connections(admin) - others))
        if kind == "threads":
            return opened, []  # the threaded reader reconnects on its next call
        _until(lambda: reader._stores["redis"]._pipe is not None)  # its handshake done: killed after, not during
        admin.execute_command("CLIENT", "KILL", "ID", opened[0])
        again = sorted(_until(lambda: _connections(admin) - others - set(opened)))
        return opened, again

    try:
        if kind == "threads":
            with FeatureReader(conf, defs) as reader:
                opened, again = watch(reader)
        else:

            async def run():
                async with AsyncFeatureReader(conf, defs) as reader:
                    return await asyncio.to_thread(watch, reader)

            opened, again = asyncio.run(run())
        assert len(opened) == 1  # no read was made: opened at start
        if kind == "asyncio":
            assert len(again) == 1  # reopened in the background, still without a read
    finally:
        own.stop()


# ---- materialize serve ------------------------------------------------------------------


def _server_settings(redis_url: str, dsn: str, **extra) -> dict:
    return {
        "definitions_dir": str(DEFAULT_DIR), "sinks": ["redis", "sql"],
        "redis": {"url": redis_url, "password_env": None, "mode": "auto"}, "sql": {"dsn": dsn, "password_env": None},
        "reader": {"timeout_ms": 5000, "breaker_cooldown_ms": 300, "cache": {"enabled": False}}, **extra,
    }  # fmt: skip


def _body_values(answer: tuple[int, bytes]) -> list | None:
    status, body = answer
    if status != 200:
        return None
    result = json.loads(body)["results"][1]
    return result["values"] if set(result["statuses"]) == {"PRESENT"} else None


def test_serve_starts_with_redis_down_answers_from_sql_and_recovers(tmp_path, pg_server, pg_db):
    gone = start_redis(tmp_path / "r")
    port = gone.port
    gone.stop()
    _write_sql(pg_db, range(10))
    server = serve(tmp_path, "down", _server_settings(f"redis://127.0.0.1:{port}/0", pg_server.dsn))
    back = None
    ask = {"features": ASK, "entities": {"consumer_id": [1, 2]}}
    try:
        status, body = server.request("GET", "/health")
        health = json.loads(body)
        assert status == 503 and health["stores"]["sql"] == "ok" and f"127.0.0.1:{port}" in health["stores"]["redis"]
        assert server.request("GET", "/health/ready") == (status, body)
        assert server.request("GET", "/health/live")[0] == 200
        assert _body_values(server.post(ask)) == [1, 2]  # from SQL
        metrics = server.request("GET", "/metrics")[1].decode()
        assert "feature_reader_fallbacks_total 1.0" in metrics and 'feature_reader_breaker_state{store="sql"} 0.0' in metrics
        back = start_redis(tmp_path / "r2", port=port)
        _write_redis(back.client(), range(10))
        assert _until(lambda: _body_values(server.post(ask)) == [1001, 1002])  # Redis again, no restart
        assert _until(lambda: server.request("GET", "/health")[0] == 200)
        assert "Traceback" not in server.log.read_text()
    finally:
        server.stop()
        if back is not None:
            back.stop()


def _reader_sessions_opened(log: Path) -> int:
    return log.read_text(errors="replace").count("application_name=feature-materializer-reader")


def test_health_uses_the_readers_connections_and_a_killed_one_is_not_a_503(tmp_path, pg_server, pg_db):
    own = start_redis(tmp_path / "h")
    _write_sql(pg_db, range(3))
    log = pg_server.data_dir / "server.log"
    with pg_server.connect() as admin:
        admin.execute("ALTER SYSTEM SET log_connections = on")
        admin.execute("SELECT pg_reload_conf()")
    server = serve(tmp_path, "probes", _server_settings(own.url, pg_server.dsn, server={"health_cache_ms": 0}))
    try:
        before = _reader_sessions_opened(log)
        statuses = [server.request("GET", "/health")[0] for _ in range(200)]
        assert statuses == [200] * 200
        assert _reader_sessions_opened(log) - before <= 2  # the reader's kept connection, not one per probe
        admin_redis = own.client()
        for _ in range(5):  # the server's Redis connection killed: the next probe still says ready
            assert admin_redis.execute_command("CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes") >= 1
            status, body = server.request("GET", "/health")
            assert status == 200, body
        with pg_server.connect() as admin:  # and the kept SQL connection ended by the server
            ended = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = 'feature-materializer-reader'"
            ).fetchone()[0]
        status, body = server.request("GET", "/health")
        assert ended >= 1 and status == 200, body
    finally:
        server.stop()
        own.stop()
        with pg_server.connect() as admin:
            admin.execute("ALTER SYSTEM RESET log_connections")
            admin.execute("SELECT pg_reload_conf()")


def test_health_probes_within_the_cache_period_ask_the_stores_once(tmp_path, pg_server, pg_db):
    own = start_redis(tmp_path / "c")
    own.client().config_resetstat()
    server = serve(tmp_path, "cached", _server_settings(own.url, pg_server.dsn, server={"health_cache_ms": 600_000}))
    try:
        answers = {server.request("GET", "/health") for _ in range(50)}
        pings = int(own.client().info("commandstats").get("cmdstat_ping", {}).get("calls", 0))
        assert len(answers) == 1 and next(iter(answers))[0] == 200 and pings == 1
    finally:
        server.stop()
        own.stop()
