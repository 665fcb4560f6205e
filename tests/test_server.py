"""`materialize serve` as a user runs it: a real server process over the values the real
job wrote, spoken to over HTTP. Its body is the byte-for-byte body of `materialize get`;
bad requests get 4xx naming the bad part; a store that is down or slow gets 503/504; the
limits hold; SIGTERM lets a request in flight finish."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import redis

from throwaway.servers import free_port, start_redis

from .support import serving
from .support.confs import env_conf
from .support.every_type import BIG
from .support.ports import first_then_real
from .support.serving import MATERIALIZE, serve, server_settings

PASSWORD = "s3rv3r-t3st-pw"


@pytest.fixture(scope="module")
def served(written_sample, tmp_path_factory):
    conf, _ = written_sample
    server = serve(tmp_path_factory.mktemp("serve"), "t", server_settings(conf))
    yield server
    assert server.stop() == -signal.SIGTERM


def test_the_body_is_the_get_commands_body(served, written_sample, tmp_path):
    conf, _ = written_sample
    request = {"features": ["every_type:n", "every_type:e", "every_type:s"], "entities": {"consumer_id": [1, 2, 4]}}
    (tmp_path / "req.json").write_text(json.dumps(request))
    printed = subprocess.run(
        [MATERIALIZE, "get", "--env", "t", "--request", str(tmp_path / "req.json")], capture_output=True, check=True,
        env={**os.environ, "FM_CONF_DIR": str(env_conf(tmp_path / "conf", "t", json.dumps(server_settings(conf))))},
    ).stdout  # fmt: skip
    status, body = served.post(request)
    assert status == 200 and body + b"\n" == printed
    parsed = json.loads(body)
    assert parsed["metadata"]["feature_names"] == ["consumer_id", "n", "e", "s"]
    assert parsed["results"][0]["values"] == [1, 2, 4]
    n, e, s = parsed["results"][1:]
    assert (n["values"], n["statuses"]) == ([BIG, None, None], ["PRESENT", "NULL_VALUE", "NOT_FOUND"])
    assert b"1152921504606846977" in body  # every digit of 2^60 + 1
    assert e["values"][0] == [0.5, -1.25, 3.0, 0.10000000149011612] and s["values"] == ["café", None, None]
    # a feature service, full feature names
    status, body = served.post(
        {"feature_service": "ranking", "entities": {"consumer_id": [1], "region": ["us"], "store_id": [7]}, "full_feature_names": True}
    )
    assert status == 200 and json.loads(body)["metadata"]["feature_names"] == [
        "consumer_id",
        "region",
        "store_id",
        "every_type__n",
        "pair_daily__score",
    ]


@pytest.mark.parametrize(
    "payload, status, kind, text",
    [
        ({"features": ["every_type:nn"], "entities": {"consumer_id": [1]}}, 404, "UnknownNameError", "did you mean 'n'?"),
        (
            {"features": ["every_typ:n"], "entities": {"consumer_id": [1]}},
            404,
            "UnknownNameError",
            "unknown source 'every_typ'; did you mean 'every_type'?",
        ),
        ({"feature_service": "rankin", "entities": {"consumer_id": [1]}}, 404, "UnknownNameError", "did you mean 'ranking'?"),
        (
            {"features": ["every_type:n"], "entities": {"consumer": [1]}},
            422,
            "EntityKeyError",
            "unknown entity key(s) 'consumer'; missing 'consumer_id'",
        ),
        (
            {"features": ["every_type:n"], "entities": {"consumer_id": ["1"]}},
            422,
            "EntityKeyError",
            "entity key 'consumer_id' row 0: expected an integer",
        ),
        (
            {"features": ["every_type:n"], "entities": {"consumer_id": list(range(6))}},
            400,
            "RequestError",
            "6 entities in one request; the limit is 5",
        ),
        ({"features": ["every_type:n"]}, 400, "RequestError", "the request has no 'entities'"),
        (b'{"features": ["every_type:n"], "entities": {', 400, "RequestError", "the request body is not JSON"),
        (
            b'{"features": ["every_type:n"], "entities": {"consumer_id": [' + b"1, " * 2000 + b"1]}}",
            413,
            "BodyTooLarge",
            "the limit is 4,096 (server.max_body_bytes)",
        ),
        # a feature twice: refused (clients read columns by position), naming it and how
        ({"features": ["every_type:n", "every_type:n"], "entities": {"consumer_id": [1]}}, 400, "RequestError",
         "feature 'every_type:n' is asked for twice as 'every_type:n'"),
        ({"features": ["every_type:s", "every_type"], "entities": {"consumer_id": [1]}}, 400, "RequestError",
         "feature 'every_type:s' is asked for twice, as 'every_type:s' and as 'every_type'"),
        # keys past int64 reported by their digits (orjson made a float of 2^64), long ones cut
        ({"features": ["every_type:n"], "entities": {"consumer_id": [1, 2**64]}}, 422, "EntityKeyError",
         "entity key 'consumer_id' row 1: 18446744073709551616 is outside int64"),
        ({"features": ["every_type:n"], "entities": {"consumer_id": [-(2**63) - 1]}}, 422, "EntityKeyError",
         "row 0: -9223372036854775809 is outside int64"),
        (b'{"features": ["every_type:n"], "entities": {"consumer_id": [' + b"7" * 4000 + b"]}}", 422, "EntityKeyError",
         "row 0: " + "7" * 40 + "...(4,000 characters) is outside int64"),
        # names from the request are cut in messages
        ({"features": ["every_type:" + "q" * 3000], "entities": {"consumer_id": [1]}}, 404, "UnknownNameError",
         "unknown feature of source 'every_type': '" + "q" * 100 + "...(3,000 characters)'"),
        ({"features": ["w" * 3000], "entities": {"consumer_id": [1]}}, 404, "UnknownNameError", "...(3,000 characters)'"),
        ({"feature_service": "v" * 3000, "entities": {"consumer_id": [1]}}, 404, "UnknownNameError", "...(3,000 characters)'"),
        ({"features": ["every_type:n"], "entities": {"k" * 3000: [1]}}, 422, "EntityKeyError", "...(3,000 characters)'"),
        ({"features": ["every_type:n"], "entities": {"consumer_id": [1]}, "u" * 3000: 1}, 400, "RequestError", "...(3,000 characters)"),
    ],
)  # fmt: skip
def test_bad_requests_get_4xx_naming_the_bad_part(served, payload, status, kind, text):
    got, body = served.post(payload)
    error = json.loads(body)
    assert (got, error["type"]) == (status, kind) and text in error["error"], error
    assert len(body) < 600, body  # whatever the request repeated


def _raw(served, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_methods_head_content_types_and_the_openapi_document(served):
    # 405 says what is allowed
    status, headers, body = _raw(served, "GET", "/get-online-features")
    assert (status, headers.get("allow"), json.loads(body)["type"]) == (405, "POST", "MethodNotAllowed")
    for path in ("/health", "/metrics", "/openapi.json"):
        status, headers, _ = _raw(served, "POST", path, b"{}", {"content-type": "application/json"})
        assert (status, headers.get("allow")) == (405, "GET, HEAD")
        # HEAD answers as GET, without the body
        got, got_headers, got_body = _raw(served, "GET", path)
        status, headers, body = _raw(served, "HEAD", path)
        assert (status, body, headers["content-type"]) == (got, b"", got_headers["content-type"])
        assert int(headers["content-length"]) > 0
    assert _raw(served, "HEAD", "/health")[1]["content-length"] == _raw(served, "GET", "/health")[1]["content-length"]
    # a body not declared JSON: 415, whatever it holds (a browser page may POST these to any origin unasked)
    ask = json.dumps({"features": ["every_type:n"], "entities": {"consumer_id": [1]}}).encode()
    for media in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/xml"):
        status, _, body = _raw(served, "POST", "/get-online-features", ask, {"content-type": media})
        error = json.loads(body)
        assert (status, error["type"]) == (415, "UnsupportedMediaType") and media.split(";")[0] in error["error"], error
    # JSON with parameters, and no Content-Type at all (Feast's remote client sends none): served
    assert _raw(served, "POST", "/get-online-features", ask, {"content-type": "application/json; charset=utf-8"})[0] == 200
    assert _raw(served, "POST", "/get-online-features", ask, {})[0] == 200
    # the route table and the document agree
    from feature_reader.server import ROUTES

    status, _, body = _raw(served, "GET", "/openapi.json")
    document = json.loads(body)
    assert status == 200 and document["openapi"].startswith("3.") and set(document["paths"]) == set(ROUTES)
    assert {m.upper() for m in document["paths"]["/health"]} == {"GET", "HEAD"}
    # a route's name from the request is cut too
    status, _, body = _raw(served, "GET", "/" + "r" * 5000)
    assert status == 404 and len(body) < 600 and "...(5,001 characters)" in json.loads(body)["error"]


def test_routes_methods_health_and_metrics(served):
    assert served.request("GET", "/get-online-features")[0] == 405
    assert served.request("GET", "/nowhere")[0] == 404
    status, body = served.request("GET", "/health")
    assert status == 200 and json.loads(body) == {"status": "ready", "stores": {"redis": "ok", "sql": "ok"}}
    assert served.post({"features": ["every_type:n"], "entities": {"consumer_id": [3]}})[0] == 200
    status, text = served.request("GET", "/metrics")
    text = text.decode()
    assert status == 200
    assert 'feature_server_request_seconds_count{route="/get-online-features",status="200"}' in text
    assert 'feature_server_request_seconds_bucket{le="0.0005",route="/get-online-features",status="200"}' in text
    assert 'feature_server_request_seconds_count{route="/get-online-features",status="404"}' in text
    assert "feature_server_in_flight_requests 0.0" in text
    counters = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("feature_reader_")}
    assert counters["feature_reader_store_reads_total"] >= 1 and "feature_reader_coalesced_total" in counters
    assert "Traceback" not in served.log.read_text()


def test_a_store_down_or_slow_gets_503_504_and_sigterm_lets_a_request_finish(written_sample, tmp_path):
    """A Redis of its own, with a password: slow (CLIENT PAUSE), then stopped."""
    conf, _ = written_sample
    own = start_redis(tmp_path / "redis", "--requirepass", PASSWORD)
    settings = server_settings(
        conf, sinks=["redis"], redis={"url": own.url, "password_env": "TEST_REDIS_PASSWORD", "mode": "standalone"},
        reader={"timeout_ms": 5000, "cache": {"enabled": False}}, server={"deadline_ms": 300, "max_in_flight": 1},
    )  # fmt: skip
    server = serve(tmp_path, "own", settings, password=PASSWORD)
    client = redis.Redis(host="127.0.0.1", port=own.port, password=PASSWORD)
    ask = {"features": ["every_type:n"], "entities": {"consumer_id": [1]}}
    try:
        assert server.post(ask)[0] == 200  # NOT_FOUND: nothing written to this Redis
        # slow: past the deadline, 504; a second request while the first is in flight: 503 at once
        client.execute_command("CLIENT", "PAUSE", "1500", "ALL")
        outcomes: list = []
        first = threading.Thread(target=lambda: outcomes.append(server.post(ask)))
        first.start()
        time.sleep(0.1)
        second = server.post(ask)
        first.join()
        assert second[0] == 503 and json.loads(second[1])["type"] == "Overloaded"
        assert outcomes[0][0] == 504 and "300 ms" in json.loads(outcomes[0][1])["error"]
        time.sleep(1.5)
        # SIGTERM while a request waits on a paused Redis: it is answered, then the process ends
        client.execute_command("CLIENT", "PAUSE", "200", "ALL")
        during = threading.Thread(target=lambda: outcomes.append(server.post(ask)))
        during.start()
        time.sleep(0.05)
        server.process.send_signal(signal.SIGTERM)
        during.join()
        # uvicorn ends by re-raising the signal it caught, once the requests in flight are answered
        assert outcomes[1][0] == 200 and server.process.wait(timeout=30) == -signal.SIGTERM
        # stopped Redis: 503 naming the server, no password anywhere
        server = serve(tmp_path, "own2", settings, password=PASSWORD)
        own.stop()
        status, body = server.post(ask)
        assert status == 503 and f"127.0.0.1:{own.port}" in json.loads(body)["error"]
        status, health = server.request("GET", "/health")
        assert status == 503 and json.loads(health)["stores"]["redis"] != "ok"
        for text in (body, health, server.log.read_bytes()):
            assert PASSWORD.encode() not in text and b"Traceback" not in text
    finally:
        server.stop()
        if own.process.poll() is None:
            own.stop()


def test_workers_each_answer_from_the_envs_conf(written_sample, tmp_path, served):
    """--workers 2: two processes behind one port, each built from the env's conf (its limits too)."""
    conf, _ = written_sample
    server = serve(tmp_path, "w2", server_settings(conf), workers=2)
    try:
        ask = {"features": ["every_type:n", "every_type:s"], "entities": {"consumer_id": [1, 2, 4]}}
        bodies = {server.post(ask) for _ in range(20)}
        assert bodies == {served.post(ask)}  # one answer, the single process's, from every worker
        status, body = server.post({"features": ["every_type:n"], "entities": {"consumer_id": list(range(6))}})
        assert status == 400 and "the limit is 5" in json.loads(body)["error"]  # reader.max_entities of the env
        children = [d for d in os.listdir("/proc") if d.isdigit() and _parent(d) == server.process.pid]
        workers = [d for d in children if b"spawn_main" in Path(f"/proc/{d}/cmdline").read_bytes()]
        assert len(workers) == 2, server.log.read_text()  # uvicorn's supervisor spawned two workers
    finally:
        server.stop()


def test_a_server_whose_port_was_taken_starts_on_another(written_sample, tmp_path, monkeypatch, taken_port):
    """The suite's own start-up: uvicorn that cannot bind exits, and serve() starts it again elsewhere."""
    conf, _ = written_sample
    pick, calls = first_then_real(taken_port, free_port)
    monkeypatch.setattr(serving, "free_port", pick)  # where serve() picks its port
    server = serve(tmp_path, "taken", server_settings(conf))
    try:
        assert len(calls) == 2 and server.port != taken_port
        assert server.request("GET", "/health", timeout=5)[0] == 200
    finally:
        server.stop()


def _parent(pid: str) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_response_goes_out_in_one_write_and_pipelined_requests_are_answered_in_order(served):
    """uvicorn writes a response's head and body apart: they leave together, after the
    turn of the event loop that wrote them, and a close still sends what was written."""
    import asyncio
    import socket

    from feature_reader.one_write import _OneWrite

    async def direct() -> list:
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, ours)
        wrapped = _OneWrite(transport, asyncio.get_running_loop())
        seen = []
        wrapped.write(b"HTTP/1.1 200 OK\r\n\r\n")
        wrapped.write(b"{}")
        try:
            peer.recv(100)
        except BlockingIOError:
            seen.append(None)  # nothing sent within the turn
        await asyncio.sleep(0.01)
        seen.append(peer.recv(100))
        wrapped.write(b"last")
        wrapped.close()
        await asyncio.sleep(0.01)
        seen += [peer.recv(100), peer.recv(100)]  # the bytes, then the end of the stream
        peer.close()
        return seen

    assert asyncio.run(direct()) == [None, b"HTTP/1.1 200 OK\r\n\r\n{}", b"last", b""]
    # the real server: two requests in one packet, two answers in order on the connection
    body = json.dumps({"features": ["every_type:n"], "entities": {"consumer_id": [1]}}).encode()
    other = json.dumps({"features": ["every_type:n"], "entities": {"consumer_id": [3, 1]}}).encode()
    one = b"POST /get-online-features HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as conn:
        conn.sendall(one % (len(body), body) + one % (len(other), other))
        received = b""
        while received.count(b"HTTP/1.1 200") < 2 or not received.endswith(b"}}"):
            chunk = conn.recv(65536)
            assert chunk, received
            received += chunk
    first, second = [json.loads(part.split(b"\r\n\r\n", 1)[1]) for part in received.split(b"HTTP/1.1 ")[1:]]
    assert first["results"][1]["values"] == [BIG] and second["results"][1]["values"] == [-5, BIG]
