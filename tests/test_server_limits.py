"""`materialize serve` against hostile clients, over raw sockets: clients that send half a
request hold no serving slot and get 408; idle and surplus connections are closed; a
stalled client does not hold SIGTERM past the shutdown grace; request heads are bounded in
size and count (431) and the server's memory with them; clients that stop reading are
dropped at the write deadline and their answers freed; a deeply nested body gets 4xx.
No traceback in any log."""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

from .support.serving import serve, server_settings

ASK = json.dumps({"features": ["every_type:n"], "entities": {"consumer_id": [1]}}).encode()
POST = b"POST /get-online-features HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"


def _connect(port: int, timeout: float = 60) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=timeout)


def _answer(conn: socket.socket) -> tuple[int | None, dict | None]:
    """(status, JSON body) of the one answer on ``conn``, read until the server closes; (None, None) if it closed without one."""
    received = b""
    try:
        while chunk := conn.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    if not received:
        return None, None
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body) if body else None


def _sockets(pid: int) -> int:
    """Sockets the process holds open."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += fd.readlink().name.startswith("socket:")
        except OSError:
            pass
    return count


def _status(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status, in kB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_clients_sending_half_a_body_hold_no_slot_and_get_408(written_sample, tmp_path):
    conf, _ = written_sample
    server = serve(tmp_path, "slow", server_settings(conf, server={"max_in_flight": 2, "read_timeout_ms": 2000}))
    try:
        stalled = []
        for _ in range(6):  # three times max_in_flight, each stopping halfway through its body
            conn = _connect(server.port)
            conn.sendall(POST % len(ASK) + ASK[: len(ASK) // 2])
            stalled.append(conn)
        time.sleep(0.3)
        # the others are served meanwhile: not one of them counts as in flight
        assert [server.post(json.loads(ASK))[0] for _ in range(3)] == [200, 200, 200]
        for conn in stalled:  # then each is answered 408 and closed
            status, body = _answer(conn)
            assert (status, body["type"]) == (408, "RequestTimeout") and "server.read_timeout_ms" in body["error"], body
            conn.close()
        # half a head is bounded alike
        conn = _connect(server.port)
        conn.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        assert _answer(conn)[0] == 408
        conn.close()
        assert server.request("GET", "/health")[0] == 200
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


def test_idle_and_surplus_connections_are_closed(written_sample, tmp_path):
    conf, _ = written_sample
    server = serve(tmp_path, "conns", server_settings(conf, server={"max_connections": 50, "idle_timeout_ms": 3000}))
    try:
        before = _sockets(server.process.pid)
        idle = [_connect(server.port) for _ in range(300)]  # connect, send nothing
        answers = [_answer(conn) for conn in idle]  # each is closed by the server: none stays open
        refused = [a for a in answers if a[0] is not None]
        assert {(status, body["type"]) for status, body in refused} == {(503, "Overloaded")}
        assert len(refused) >= 250, len(refused)  # at most max_connections were kept, then closed when idle
        assert all(a == (None, None) for a in answers if a[0] is None)
        for conn in idle:
            conn.close()
        deadline = time.monotonic() + 30
        while _sockets(server.process.pid) > before:
            assert time.monotonic() < deadline, (before, _sockets(server.process.pid))
            time.sleep(0.2)
        # keep-alive after a response is bounded alike; a new client is served
        conn = _connect(server.port)
        conn.sendall(POST % len(ASK) + ASK)
        status, _ = _answer(conn)  # read until the server closes the idle connection
        assert status == 200
        conn.close()
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


def test_sigterm_with_stalled_clients_stops_within_the_grace(written_sample, tmp_path):
    conf, _ = written_sample
    settings = server_settings(conf, server={"read_timeout_ms": 120_000, "idle_timeout_ms": 120_000, "shutdown_grace_ms": 1000})
    server = serve(tmp_path, "term", settings)
    half_body = _connect(server.port)
    half_body.sendall(POST % len(ASK) + ASK[:10])
    half_head = _connect(server.port)
    half_head.sendall(b"POST /get-online-features HTTP/1.1\r\nhost: x\r\n")
    idle = _connect(server.port)
    time.sleep(0.3)
    start = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=60) == -signal.SIGTERM
    # uvicorn's grace was 30 s and the stalled client held it whole; now it is 1 s (20: a busy machine)
    assert time.monotonic() - start < 20
    status, body = _answer(half_body)
    assert (status, body["type"]) == (503, "ShuttingDown")
    assert _answer(half_head) == (None, None) and _answer(idle) == (None, None)
    log = server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_request_heads_are_bounded_in_size_and_count(written_sample, tmp_path):
    conf, _ = written_sample
    server = serve(tmp_path, "heads", server_settings(conf))
    pid = server.process.pid
    try:
        # 1,000 header lines, and one header line of 1 MB: 431 (the defaults: 100 lines, 16 KB)
        many = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(1000)) + b"\r\n"
        big = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-big: " + b"a" * (1 << 20) + b"\r\n\r\n"
        for head in (many, big):
            conn = _connect(server.port)
            try:
                conn.sendall(head)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before the whole head was sent: the answer was written first
            status, body = _answer(conn)
            assert (status, body["type"]) == (431, "HeadersTooLarge") and "server.max_header_bytes" in body["error"], body
            conn.close()
        # a head under the limit, arriving in pieces, is served (its bytes counted once)
        conn = _connect(server.port)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        head = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n" + b"".join(
            b"x-p%d: %s\r\n" % (i, b"v" * 1000) for i in range(12)
        )
        for at in range(0, len(head), 1500):
            conn.sendall(head[at : at + 1500])
            time.sleep(0.05)
        conn.sendall(b"\r\n")
        assert _answer(conn)[0] == 200
        conn.close()
        # a 64 MB header line: refused after its first bytes; the server's peak memory hardly moves
        peak = _status(pid, "VmHWM")
        conn = _connect(server.port)
        sent = 0
        try:
            conn.sendall(b"GET /health HTTP/1.1\r\nconnection: close\r\nx-big: ")
            for _ in range(64):
                conn.sendall(b"a" * (1 << 20))
                sent += 1
            conn.sendall(b"\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server stopped reading: refused
        assert sent < 64 or _answer(conn)[0] == 431
        conn.close()
        assert _status(pid, "VmHWM") - peak < 16 * 1024, (peak, _status(pid, "VmHWM"))  # kB: the buffered head stays small
        assert server.request("GET", "/health")[0] == 200
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


BIG_ASK = json.dumps({"features": [f"every_type:{f}" for f in ("f", "f32", "n", "b", "s", "e", "il", "sl")],
                      "entities": {"consumer_id": [1, 2, 3] * 7000}}).encode()  # fmt: skip
"""A request whose answer (about 8 MB) is larger than what the kernel holds for a client that does not read."""
BIG = {"reader": {"max_entities": 21_000}, "server": {"max_body_bytes": 1 << 20}}


def _big_answer(port: int) -> int:
    """The size of BIG_ASK's answer, read whole."""
    with _connect(port) as conn:
        conn.sendall(POST % len(BIG_ASK) + BIG_ASK)
        received = b""
        while b"\r\n\r\n" not in received:
            received += conn.recv(65536)
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")))
        while len(body) < length:
            body += conn.recv(1 << 20)
        return length


def _not_reading(port: int, clients: int) -> list[socket.socket]:
    """Clients that each send three requests for a large answer at once, then never read (a small
    receive buffer, so the kernel holds little for them)."""
    conns = []
    for _ in range(clients):
        conn = socket.socket()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        conn.settimeout(60)
        conn.connect(("127.0.0.1", port))
        conn.sendall((POST % len(BIG_ASK) + BIG_ASK) * 3)
        conns.append(conn)
    return conns


def _received_until_dropped(conn: socket.socket) -> int:
    """Bytes read until the server closes or resets the connection (socket.timeout if it never does)."""
    received = 0
    try:
        while chunk := conn.recv(1 << 20):
            received += len(chunk)
    except ConnectionResetError:
        pass
    conn.close()
    return received


def _pinned_per_client(answer: int) -> int:
    """Bytes of a first answer the server must keep itself for a client that does not read: what the
    kernel's send buffer (at most tcp_wmem's maximum) and the client's 4 KB receive buffer do not take."""
    kernel = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2]) + 2 * 4096
    assert answer > kernel + (1 << 20), (answer, kernel)  # else the kernel would hold the answer: no test
    return answer - kernel


def _wait_for(what, check, timeout: float = 60) -> None:
    """Until ``check()``; past ``timeout`` an AssertionError saying ``what()``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what()
        time.sleep(0.1)


def test_clients_that_stop_reading_are_dropped_at_the_write_deadline_and_their_answers_freed(written_sample, tmp_path):
    """Pipelined requests behind a large answer, never read: the answer stayed in the server's memory
    as long as the client kept the socket (no read, idle or in-flight bound applied)."""
    conf, _ = written_sample
    settings = server_settings(conf, **BIG)
    settings["server"].update(write_timeout_ms=4000, read_timeout_ms=3000, idle_timeout_ms=3000, max_unsent_bytes=1 << 30)
    server = serve(tmp_path, "unread", settings)
    pid = server.process.pid
    try:
        answer = max(_big_answer(server.port) for _ in range(2))  # twice: the server's memory warmed to such answers
        pinned = _pinned_per_client(answer) // 1024  # kB, as /proc says
        level = _status(pid, "VmRSS")
        clients = _not_reading(server.port, 10)
        # the first answers are made and held: at least three at once (the deadline is 4 s, an answer takes < 1 s)
        rss = lambda: _status(pid, "VmRSS")  # noqa: E731
        _wait_for(lambda: f"only {_unsent(server):,.0f} bytes unsent (RSS {rss()} kB)", lambda: _unsent(server) > 3 * pinned * 1024)
        # past the deadline each is dropped with what it held: RSS back within one client's answer of its level
        _wait_for(lambda: f"RSS {rss()} kB not back near {level} (+{pinned})", lambda: rss() < level + pinned, timeout=30)
        for conn in clients:
            assert _received_until_dropped(conn) < answer  # closed or reset before its first answer was whole
        assert _unsent(server) == 0
        assert _big_answer(server.port) == answer  # a client that reads is served
    finally:
        server.stop()
    log = server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def test_answers_waiting_for_slow_clients_are_bounded_server_wide(written_sample, tmp_path):
    conf, _ = written_sample
    settings = server_settings(conf, **BIG)
    settings["server"].update(write_timeout_ms=5000, max_unsent_bytes=1 << 20)
    server = serve(tmp_path, "unsent", settings)
    try:
        answer = _big_answer(server.port)
        assert _pinned_per_client(answer) > 1 << 20  # one client that stops reading passes the bound
        clients = _not_reading(server.port, 2)
        statuses: list = []

        def refused() -> bool:
            statuses.append(server.post(json.loads(ASK)))
            return statuses[-1][0] != 200

        _wait_for(lambda: f"never refused: {statuses[-3:]}", refused, timeout=30)
        status, body = statuses[-1]
        assert (status, json.loads(body)["type"]) == (503, "Overloaded") and "server.max_unsent_bytes" in json.loads(body)["error"], body
        # they are dropped at the deadline (not read meanwhile: a read would let their answers leave): the bound is free again
        _wait_for(lambda: f"still refused: {statuses[-1]}", lambda: not refused(), timeout=30)
        for conn in clients:
            assert _received_until_dropped(conn) < answer
        assert _unsent(server) == 0
    finally:
        server.stop()
    log = server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def _unsent(server) -> float:
    status, text = server.request("GET", "/metrics")
    assert status == 200, text
    return float(next(line.split()[1] for line in text.decode().splitlines() if line.startswith("feature_server_unsent_bytes ")))


def test_sigterm_with_clients_that_stop_reading_stops_quietly(written_sample, tmp_path):
    """Each such client logged a traceback at SIGTERM (its next answer cancelled while waiting to be written)."""
    conf, _ = written_sample
    settings = server_settings(conf, **BIG)
    settings["server"].update(write_timeout_ms=120_000, shutdown_grace_ms=2000)
    server = serve(tmp_path, "unread-term", settings)
    try:
        answer = _big_answer(server.port)
        pinned = _pinned_per_client(answer)
        clients = _not_reading(server.port, 4)
        # what the server says it holds, not its RSS: garbage of the first answer's request, collected
        # or not by then, moved the RSS as much as three held answers on a busy machine
        _wait_for(lambda: f"the answers were never held: {_unsent(server):,.0f} bytes unsent", lambda: _unsent(server) > 3 * pinned)
        time.sleep(1)  # the pipelined requests behind them reach the server
        start = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == -signal.SIGTERM
        assert time.monotonic() - start < 20  # within the grace (2 s; 20: a busy machine), not the 120 s write deadline
    finally:
        server.stop()
    for conn in clients:
        assert _received_until_dropped(conn) < answer
    log = server.log.read_text()
    assert "Traceback" not in log and "ERROR" not in log, log


def _head(size: int) -> bytes:
    """A GET /health head of exactly ``size`` bytes (a header padded to it)."""
    start, pad = b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\nx-pad: ", b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(pad)) + pad


def test_a_head_is_counted_from_the_packet_it_begins_in(written_sample, tmp_path):
    """The chunk a head began in was not counted: a head eight times the limit passed when its
    blank line came in a later packet."""
    conf, _ = written_sample
    server = serve(tmp_path, "packets", server_settings(conf, server={"max_header_bytes": 4096}))
    try:
        for size, cuts, status in [
            (4096, (4094,), 200),
            (4096, (1000, 3000, 4095), 200),
            (4097, (4095,), 431),
            (4097, (1000, 3000, 4096), 431),
            (8 * 4096, (8 * 4096 - 2,), 431),
        ]:
            head = _head(size)
            assert len(head) == size
            conn = _connect(server.port)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                for start, end in zip((0, *cuts), (*cuts, size)):
                    conn.sendall(head[start:end])
                    time.sleep(0.1)  # a packet, read on its own
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before the last packet: the answer was written first
            got, body = _answer(conn)
            conn.close()
            assert got == status, (size, cuts, got, body)
            if status == 431:
                assert body["type"] == "HeadersTooLarge" and "server.max_header_bytes" in body["error"], body
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


def test_a_deeply_nested_body_gets_4xx_and_no_log_line(written_sample, tmp_path):
    """A 19-digit number sends a body to the json module's exact parse, which raised
    RecursionError on deep nesting (500, an error logged each time); a list nested 1,000 deep
    as a key (orjson takes up to 1,024) raised it when named in the error."""
    conf, _ = written_sample
    server = serve(tmp_path, "deep", server_settings(conf, server={"max_body_bytes": 1 << 20}))
    long = b"1234567890123456789"
    cases = [
        (b'{"features": ["every_type:n"], "entities": {"consumer_id": [' + long + b", " + b"[" * 100_000 + b"]" * 100_000 + b"]}}",
         400, "the request body is not JSON: depth limit exceeded"),
        (b'{"features": ["every_type:n"], "entities": {"consumer_id": [' + long + b"]}, " + b'"x": {' * 50_000 + b"}" * 50_000 + b"}",
         400, "the request body is not JSON: depth limit exceeded"),
        (b'{"features": ["every_type:n"], "entities": {"consumer_id": [1, ' + b"[" * 1000 + b"]" * 1000 + b"]}}",
         422, "entity key 'consumer_id' row 1: expected an integer, got list"),
    ]  # fmt: skip
    try:
        logged = server.log.read_text()
        for body, status, text in cases:
            for _ in range(5):
                got, answer = server.post(body)
                assert (got, json.loads(answer)["error"]) == (status, text), answer[:300]
        assert server.post(json.loads(ASK))[0] == 200
        assert server.log.read_text() == logged  # not a line more: an unauthenticated caller cannot fill the log
    finally:
        server.stop()


def test_a_long_name_or_key_gets_a_short_answer(written_sample, tmp_path):
    """At the default body limit (1 MB): a 500,000-character name once made a 500 KB 404."""
    conf, _ = written_sample
    server = serve(tmp_path, "long", server_settings(conf, server={"max_body_bytes": 1 << 20}))
    try:
        cases = [
            ({"features": ["every_type:" + "x" * 500_000], "entities": {"consumer_id": [1]}}, 404, "...(500,000 characters)'"),
            ({"features": ["y" * 500_000 + ":n"], "entities": {"consumer_id": [1]}}, 404, "...(500,000 characters)'"),
            # past Python's 4,300-digit conversion limit: still a 422 naming the key, digits cut
            ({"features": ["every_type:n"], "entities": {"consumer_id": [int("9" * 4000), 1]}}, 422, "row 0: " + "9" * 40 + "...(4,000"),
        ]
        for payload, status, text in cases:
            got, body = server.post(payload)
            assert (got, text in json.loads(body)["error"], len(body) < 600) == (status, True, True), body[:1000]
        body = b'{"features": ["every_type:n"], "entities": {"consumer_id": [' + b"8" * 100_000 + b"]}}"
        got, answer = server.post(body)
        assert got == 422 and "row 0: " + "8" * 40 + "...(100,000 characters) is outside int64" in json.loads(answer)["error"], answer
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()


def test_a_request_still_unanswered_when_the_grace_runs_out_gets_503_without_a_traceback(written_sample, tmp_path):
    """A Redis of its own, paused: the request waits on it when SIGTERM comes; past the grace it
    is answered 503 and the process stops (uvicorn's grace was 30 s, then a traceback)."""
    import threading

    import redis

    from throwaway.servers import start_redis

    conf, _ = written_sample
    own = start_redis(tmp_path / "redis")
    settings = server_settings(
        conf, sinks=["redis"], redis={"url": own.url, "password_env": None, "mode": "standalone"},
        reader={"timeout_ms": 20_000, "cache": {"enabled": False}}, server={"deadline_ms": 20_000, "shutdown_grace_ms": 500},
    )  # fmt: skip
    server = serve(tmp_path, "grace", settings)
    try:
        assert server.post(json.loads(ASK))[0] == 200
        redis.Redis(host="127.0.0.1", port=own.port).execute_command("CLIENT", "PAUSE", "15000", "ALL")
        outcome: list = []
        waiting = threading.Thread(target=lambda: outcome.append(server.post(json.loads(ASK))))
        waiting.start()
        time.sleep(0.5)
        start = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == -signal.SIGTERM
        assert time.monotonic() - start < 10  # the grace, 0.5 s, on a busy machine; Redis stays paused 15 s
        waiting.join()
        status, body = outcome[0]
        assert (status, json.loads(body)["type"]) == (503, "ShuttingDown")
    finally:
        server.stop()
        own.stop()
    log = server.log.read_text()
    assert "Traceback" not in log and "shutdown grace (server.shutdown_grace_ms) ran out" in log, log


def test_serve_raises_the_open_file_limit_that_max_connections_needs():
    import resource
    import subprocess
    import sys

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    code = (
        f"import resource; resource.setrlimit(resource.RLIMIT_NOFILE, (300, {hard})); from feature_reader.server import _open_files; "
        "_open_files(1024); print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])"
    )
    soft = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
    assert int(soft) == (1024 + 256 if hard == resource.RLIM_INFINITY else min(1024 + 256, hard))


def test_malformed_and_upgrade_requests_log_one_warning_a_minute(written_sample, tmp_path):
    """A caller without a token repeating a malformed request or an upgrade (websocket, h2c)
    adds one warning line per kind a minute, not one per request."""
    conf, _ = written_sample
    server = serve(tmp_path, "quiet", server_settings(conf))
    malformed = b"GET / HTTP/1.1\r\nhost x\r\n\r\n"
    upgrades = [
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: upgrade\r\nupgrade: websocket\r\nsec-websocket-version: 13\r\n"
        b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
        b"http2-settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
    ]
    try:
        for _ in range(20):
            for raw in (malformed, *upgrades):
                with _connect(server.port) as conn:
                    conn.sendall(raw)
                    first = conn.recv(65536)  # the status line (an upgrade's connection stays open)
                    assert first.split(b" ", 2)[1] == (b"400" if raw is malformed else b"200"), first
        lines = [line for line in server.log.read_text().splitlines() if "WARNING" in line.upper()]
        assert sorted(line.split(":", 1)[-1].strip() for line in lines) == [
            "Invalid HTTP request received.",
            "Unsupported upgrade request (websocket, h2c): answered as plain HTTP.",
        ], lines
    finally:
        server.stop()


def test_quiet_warnings_say_how_many_were_not_logged():
    import logging

    from feature_reader.one_write import QuietWarnings

    class Lines(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    logger, lines, now = logging.getLogger("test.quiet"), Lines(), [100.0]
    logger.addHandler(lines)
    warnings = QuietWarnings(logger, every=60, clock=lambda: now[0])
    for t in (100, 101, 130, 159.9, 160, 161, 300):
        now[0] = t
        warnings.warn("bad")
    warnings.warn("other")
    assert lines.lines == ["bad", "bad (3 more in the last 60 s, not logged)", "bad (1 more in the last 140 s, not logged)", "other"]


def test_requests_waiting_behind_one_are_bounded_per_connection(written_sample, tmp_path):
    """uvicorn parsed every request of what it read at once (256 KiB: 89 requests a connection were
    seen waiting, held until a full collection). At most MAX_PIPELINED wait: the client gets the
    answers of the one being answered and those waiting, the last with `connection: close`."""
    from feature_reader.one_write import MAX_PIPELINED

    conf, _ = written_sample
    server = serve(tmp_path, "pipelined", server_settings(conf))
    try:
        with _connect(server.port) as conn:
            conn.sendall((POST % len(ASK) + ASK) * 40)  # one segment: read and parsed at once
            received = b""
            while chunk := conn.recv(65536):
                received += chunk
        heads = [part.split(b"\r\n\r\n")[0] for part in received.split(b"HTTP/1.1 ")[1:]]
        assert len(heads) == 1 + MAX_PIPELINED and all(h.startswith(b"200 OK") for h in heads), heads[:2]
        assert [b"connection: close" in h for h in heads] == [False] * MAX_PIPELINED + [True]
        with _connect(server.port) as conn:  # a client that waits for each answer is not bounded
            for _ in range(40):
                conn.sendall(POST % len(ASK) + ASK)
                assert conn.recv(65536).startswith(b"HTTP/1.1 200")
    finally:
        server.stop()
    log = server.log.read_text()
    assert "Traceback" not in log and "WARNING" not in log.upper(), log


MMAP_PROBE = r"""
import ctypes, sys
from feature_reader.one_write import fixed_mmap_threshold

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
                                               "fordblks", "keepcost")]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
if sys.argv[1] == "fixed":
    fixed_mmap_threshold()
big = bytearray(4 << 20)
del big  # freed: glibc's own threshold rises to 4 MiB
before = libc.mallinfo2().hblkhd
block = bytearray(1 << 20)
print(libc.mallinfo2().hblkhd - before)
"""


def test_large_bodies_get_pages_of_their_own_after_a_larger_one_was_freed():
    """glibc raises its mmap threshold to the largest block freed: after a 4 MB body, 1 MB ones
    came from the heap, whose freed pages it keeps (the server's RSS stayed up). The server
    fixes the threshold at start: a 1 MB block is mapped (mallinfo2's hblkhd), as the first was."""
    import subprocess
    import sys

    def mapped(mode: str) -> int:
        return int(subprocess.run([sys.executable, "-c", MMAP_PROBE, mode], capture_output=True, text=True, check=True).stdout)

    assert mapped("default") == 0  # glibc's own rule: from the heap
    assert mapped("fixed") >= 1 << 20


TRIM_PROBE = r"""
import asyncio, sys
from feature_reader import one_write
from feature_reader.one_write import give_back_soon

trims = []
real_trim = one_write._MALLOC_TRIM
one_write._MALLOC_TRIM = lambda pad: trims.append(pad) or real_trim(pad)  # counted, still made

def rss_kb():
    return int(next(l.split()[1] for l in open("/proc/self/status") if l.startswith("VmRSS:")))

parts = [b"x" * 1000 + bytes([i % 256]) for i in range(30000)]  # a large body's parts: 1 KB blocks, from the heap
kept = parts[::16]  # some stay (say, in the cache): the heap's freed pages lie between blocks in use
del parts
freed = rss_kb()

async def main():
    loop = asyncio.get_running_loop()
    if sys.argv[1] == "asked":
        for _ in range(3):
            give_back_soon(loop)  # asked again and again: one trim
    await asyncio.sleep(1.5)

asyncio.run(main())
print(freed - rss_kb(), len(trims))
"""


def test_memory_a_large_body_left_in_the_heap_is_given_back():
    """A 1 MB body's thousand 1 KB strings come from glibc's heap, which keeps their pages once
    freed below a block still in use: the soak's hostile phase left the RSS up by them. Asked
    after a large body, the server has glibc give them back within a second."""
    import subprocess
    import sys

    def given_back_kb(mode: str) -> tuple[int, int]:
        out = subprocess.run([sys.executable, "-c", TRIM_PROBE, mode], capture_output=True, text=True, check=True).stdout.split()
        return int(out[0]), int(out[1])

    kb, trims = given_back_kb("not asked")
    assert kb < 5_000 and trims == 0
    kb, trims = given_back_kb("asked")
    assert kb > 15_000  # of about 28 MB freed: the pages no block in use touches
    assert trims == 1  # asked three times within the second: one trim (each holds the event loop)
