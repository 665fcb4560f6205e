"""The throwaway servers the suite starts: a port found free but taken before the server binds
it (an outgoing connection's source port, a cluster started at the same time) means a start on
another port, not a failed test. (The feature server and TLS Redis: in their own test files.)"""

from __future__ import annotations

import pytest

import throwaway.cluster
import throwaway.servers
from throwaway.cluster import start_cluster
from throwaway.servers import start_postgres, start_redis

from .support.ports import first_then_real


def test_redis_starts_on_another_port_when_its_port_is_taken(tmp_path, monkeypatch, taken_port):
    pick, calls = first_then_real(taken_port, throwaway.servers.free_port)
    monkeypatch.setattr(throwaway.servers, "free_port", pick)
    server = start_redis(tmp_path / "r")
    try:
        assert len(calls) == 2 and server.port != taken_port
        assert server.client().ping() is True
    finally:
        server.stop()


def test_redis_asked_for_a_taken_port_fails_naming_it(tmp_path, taken_port):
    with pytest.raises(RuntimeError, match=f"port {taken_port} did not start"):
        start_redis(tmp_path / "r", port=taken_port)


def test_a_cluster_starts_on_other_ports_when_one_is_taken(tmp_path, monkeypatch, taken_port):
    real, calls = throwaway.cluster.free_ports, []

    def ports(n):
        calls.append(n)
        return [taken_port, *real(n - 1)] if len(calls) == 1 else real(n)

    monkeypatch.setattr(throwaway.cluster, "free_ports", ports)
    cluster = start_cluster(tmp_path / "c", 3, 0)
    try:
        assert len(calls) == 2 and taken_port not in cluster.ports
        assert sorted(cluster.primaries()) == sorted(cluster.ports)
    finally:
        cluster.stop()


def test_postgres_starts_on_another_port_when_its_port_is_taken(monkeypatch, taken_port):
    pick, calls = first_then_real(taken_port, throwaway.servers.free_port)
    monkeypatch.setattr(throwaway.servers, "free_port", pick)
    server = start_postgres()
    try:
        assert len(calls) == 2 and server.port != taken_port
        with server.connect() as conn:
            assert conn.execute("SELECT current_setting('port')").fetchone()[0] == str(server.port)
    finally:
        server.stop()


def test_a_start_that_fails_for_another_reason_is_not_tried_again(tmp_path, monkeypatch):
    real, calls = throwaway.servers.free_port, []
    monkeypatch.setattr(throwaway.servers, "free_port", lambda: calls.append(1) or real())
    with pytest.raises(RuntimeError, match="did not start") as failed:
        start_redis(tmp_path / "r", "--no-such-option", "yes")
    assert not isinstance(failed.value, throwaway.servers.PortTaken) and len(calls) == 1
    assert "no-such-option" in (tmp_path / "r" / "redis.out").read_text()  # the log it names says why
