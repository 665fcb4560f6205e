"""The throwaway servers the suite starts: a port found free but taken before the server binds
it (an outgoing connection's source port, a cluster started at the same time) means a start on
another port, not a failed test. The port is taken here by a socket held open."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

import bench.local_cluster
import bench.servers
from bench.local_cluster import start_cluster
from bench.servers import start_postgres, start_redis


@pytest.fixture
def taken() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # bound, not listening: a connection there is refused, as to a port in use as a source port
        yield held.getsockname()[1]


def first_then_real(first, real):
    calls = []

    def pick(*args):
        calls.append(args)
        return first if len(calls) == 1 else real(*args)

    return pick, calls


def test_redis_starts_on_another_port_when_its_port_is_taken(tmp_path, monkeypatch, taken):
    pick, calls = first_then_real(taken, bench.servers.free_port)
    monkeypatch.setattr(bench.servers, "free_port", pick)
    server = start_redis(tmp_path / "r")
    try:
        assert len(calls) == 2 and server.port != taken
        assert server.client().ping() is True
    finally:
        server.stop()


def test_redis_asked_for_a_taken_port_fails_naming_it(tmp_path, taken):
    with pytest.raises(RuntimeError, match=f"port {taken} did not start"):
        start_redis(tmp_path / "r", port=taken)


def test_a_cluster_starts_on_other_ports_when_one_is_taken(tmp_path, monkeypatch, taken):
    real = bench.local_cluster.free_ports
    pick, calls = first_then_real(None, real)

    def ports(n):
        return [taken, *real(n - 1)] if pick(n) is None else real(n)

    monkeypatch.setattr(bench.local_cluster, "free_ports", ports)
    cluster = start_cluster(tmp_path / "c", 3, 0)
    try:
        assert len(calls) == 2 and taken not in cluster.ports
        assert sorted(cluster.primaries()) == sorted(cluster.ports)
    finally:
        cluster.stop()


def test_postgres_starts_on_another_port_when_its_port_is_taken(monkeypatch, taken):
    pick, calls = first_then_real(taken, bench.servers.free_port)
    monkeypatch.setattr(bench.servers, "free_port", pick)
    server = start_postgres()
    try:
        assert len(calls) == 2 and server.port != taken
        with server.connect() as conn:
            assert conn.execute("SELECT current_setting('port')").fetchone()[0] == str(server.port)
    finally:
        server.stop()
