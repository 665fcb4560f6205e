"""The hostile phase's clients (faults.hostile runs them together, each in a thread of the
driver, for the phase's window):

- token holders whose token verifies but grants nothing the soak reads, sending bodies at
  the server's limits, each with references never sent before: 1,000 references of about
  1 KB (just under ``server.max_body_bytes``: 403), 1,001 short ones (past
  ``reader.max_features``: 400), or a body past ``max_body_bytes`` (413);
- clients that pipeline requests for 100 x 50 answers over a 4 KB receive buffer and never
  read: each is held until the server drops it (its write deadline), then comes back;
- fresh tokens reading one entity while the JWKS trickles: verified with the keys kept.
"""

from __future__ import annotations

import http.client
import random
import socket
import statistics
import threading
import time

import orjson

MAX_BODY = 1 << 20
"""server.max_body_bytes (the default)."""
MAX_FEATURES = 1000
"""reader.max_features (the default)."""
RECEIVE_BUFFER = 4096
TCP_CLOSE, TCP_CLOSE_WAIT = 7, 8
"""tcpi_state of a connection reset by its peer, and of one its peer closed."""


def refused_body(holder: int, n: int) -> bytes:
    """The ``n``-th body of a holder: every 10th past max_features (400), every 10th past
    max_body_bytes (413), the rest 1,000 distinct references just under max_body_bytes (403)."""
    kind = n % 10
    if kind == 9:
        refs = [f"h{holder}n{n}s{j}:f" for j in range(MAX_FEATURES + 1)]
    else:
        pad = "x" * (1150 if kind == 8 else 1010)  # 1,000 x ~1,030 bytes: about 1.03 MB against the 1 MiB limit
        refs = [f"h{holder}n{n:07d}s{j:04d}{pad}:f" for j in range(MAX_FEATURES)]
    return orjson.dumps({"features": refs, "entities": {"entity_id": [1]}})


def send_refused(port: int, holder: int, token: str, rate: float, stop: threading.Event, tally: dict) -> None:
    """One token holder: a refused body every 1/rate s, over keep-alive (a new connection
    after the server closes one, as after its 413); answers tallied by status."""
    connection, n, began = None, 0, time.monotonic()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    while not stop.is_set():
        body = refused_body(holder, n)
        connection = connection or http.client.HTTPConnection("127.0.0.1", port, timeout=15)
        status, keep = _exchange(connection, body, headers)
        if not keep:
            connection.close()
            connection = None
        tally[status] = tally.get(status, 0) + 1
        tally["bytes_sent"] = tally.get("bytes_sent", 0) + len(body)
        n += 1
        stop.wait(max(0.0, began + n / rate - time.monotonic()))
    if connection is not None:
        connection.close()


def _exchange(connection: http.client.HTTPConnection, body: bytes, headers: dict) -> tuple[str, bool]:
    """(the answer's status, or the error's name; whether the connection stays open). A server may
    answer and close before the body is all sent (413 on Content-Length): the answer is read
    then, as curl does, rather than counted as the send's error."""
    unsent = None
    try:
        connection.request("POST", "/get-online-features", body, headers)
    except OSError as exc:
        unsent = exc  # whatever the server answered is read below
    try:
        answer = connection.getresponse()
        answer.read()
        return str(answer.status), unsent is None and answer.getheader("connection", "").lower() != "close"
    except (OSError, http.client.HTTPException) as exc:
        return type(unsent or exc).__name__, False


def pipelined(token: str, names: list[str], entities: int, depth: int, rng: random.Random) -> bytes:
    """``depth`` requests for 100 x 50 answers (random entities of the table), in one buffer."""
    out = []
    for _ in range(depth):
        body = orjson.dumps({"features": names, "entities": {"entity_id": rng.sample(range(entities), 100)}})
        head = (f"POST /get-online-features HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {token}\r\nContent-Length: {len(body)}\r\n\r\n")  # fmt: skip
        out.append(head.encode() + body)
    return b"".join(out)


class NonReaders:
    """``count`` connections that pipeline ``depth`` requests and never read; one dropped by
    the server (a reset: its write deadline) or closed by it is replaced by a new one."""

    def __init__(self, port: int, token: str, names: list[str], entities: int, count: int, depth: int):
        self.port, self.count = port, count
        rng = random.Random(41)
        self.requests = [pipelined(token, names, entities, depth, rng) for _ in range(4)]
        self.open: list[list] = []  # [socket, opened at, bytes still to send]
        self.held_reset: list[float] = []
        self.closed = self.refused = self.connections = 0

    def _connect(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)  # before connect: the window it offers
        try:
            s.connect(("127.0.0.1", self.port))
        except OSError:
            self.refused += 1
            s.close()
            return
        s.setblocking(False)
        self.connections += 1
        self.open.append([s, time.monotonic(), self.requests[self.connections % len(self.requests)]])

    def _turn(self) -> None:
        """Send what the sockets take; a connection the server ended is counted and replaced."""
        for entry in list(self.open):
            s, opened, pending = entry
            state = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
            if state in (TCP_CLOSE, TCP_CLOSE_WAIT):
                if state == TCP_CLOSE:
                    self.held_reset.append(time.monotonic() - opened)
                else:
                    self.closed += 1
                s.close()
                self.open.remove(entry)
                continue
            if pending:
                try:
                    entry[2] = pending[s.send(pending) :]
                except BlockingIOError:
                    pass
                except OSError:
                    entry[2] = b""
        while len(self.open) < self.count:
            self._connect()

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(0.2):
            self._turn()

    def notes(self, write_deadline: float) -> dict:
        now = time.monotonic()
        overstayed = sum(1 for held in self.held_reset if held > write_deadline + 2) + sum(
            1 for _, opened, _ in self.open if now - opened > write_deadline + 2
        )
        still = len(self.open)
        for s, _, _ in self.open:
            s.close()
        held = self.held_reset
        return {
            "pipelining_clients": self.count, "connections": self.connections, "reset_by_server": len(held),
            "closed_by_server": self.closed, "refused_at_connect": self.refused, "still_held_at_the_end": still,
            "held_until_reset_seconds": {"median": round(statistics.median(held), 2) if held else None,
                                         "max": round(max(held), 2) if held else None},
            "held_past_the_write_deadline_plus_2_s": overstayed,
        }  # fmt: skip


def probe_fresh_tokens(url: str, signer, role: str, names: list[str], stop: threading.Event, tally: dict) -> None:
    """Each second a token never seen before reads one entity: verified with the keys the server holds."""
    import urllib.error
    import urllib.request

    while not stop.wait(1.0):
        body = orjson.dumps({"features": names, "entities": {"entity_id": [random.randrange(100)]}})
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {signer.token([role])}"}
        request = urllib.request.Request(f"{url}/get-online-features", body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                status = str(answer.status)
        except urllib.error.HTTPError as exc:
            status = str(exc.code)
        except OSError as exc:
            status = type(exc).__name__
        tally[status] = tally.get(status, 0) + 1
