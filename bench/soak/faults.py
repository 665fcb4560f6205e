"""The faults the soak injects, one at a time. Each returns its window: when the fault
began and when the store (or the clients) were back, wall-clock seconds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis


@dataclass
class Window:
    name: str
    start: float
    back: float
    notes: dict = field(default_factory=dict)


def redis_paused(redis, seconds: float) -> Window:
    """SIGSTOP then SIGCONT: a server that holds its connections open and answers nothing."""
    start = time.time()
    os.kill(redis.process.pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(redis.process.pid, signal.SIGCONT)
    return Window("redis paused", start, time.time(), {"paused_seconds": seconds})


def redis_restarted(stack, down: float) -> Window:
    """SIGTERM, ``down`` seconds, the same server started again on its port (appendonly: data comes back)."""
    from throwaway.servers import restart_redis

    start = time.time()
    stack.redis = restart_redis(stack.redis, stack.redis_dir, *stack.redis_args, down=down)
    back = time.time()
    keys = stack.redis.client().dbsize()
    return Window("redis restarted", start, back, {"down_seconds": down, "keys_after_restart": keys, "keys_before": stack.redis_keys})


def postgres_restarted(pg, down: float) -> Window:
    from throwaway.servers import restart_postgres

    start = time.time()
    restart_postgres(pg, down)
    return Window("postgres restarted", start, time.time(), {"down_seconds": down})


def cluster_failover(cluster) -> Window:
    """SIGKILL the primary owning slot 0; back once its replica is promoted and every live node agrees."""
    primary = cluster.primaries()[0]
    replica = cluster.replica_of(primary)
    start = time.time()
    cluster.kill(primary)
    deadline = time.monotonic() + 60
    while True:  # the live nodes notice only after the node timeout: until then they still say ok
        try:
            if replica in cluster.primaries() and primary not in cluster.primaries():
                break
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replica {replica} of the killed primary {primary} was not promoted within 60 s")
        time.sleep(0.05)
    cluster.wait_ok(timeout=60, without=(primary,))
    back = time.time()
    return Window("redis cluster primary killed", start, back, {"killed": primary, "promoted": replica, "primaries": cluster.primaries()})


def nightly_run(conf_dir: Path, date, log: Path) -> Window:
    """`materialize run` for the new date: the real job writing new values for the same keys."""
    import sys

    from bench.standard import SOURCE

    exe = str(Path(sys.executable).parent / "materialize")
    start = time.time()
    with log.open("wb") as out:
        done = subprocess.run(
            [exe, "run", "--env", "soak", "--date", date.isoformat(), "--source", SOURCE],
            env={**os.environ, "FM_CONF_DIR": str(conf_dir)}, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    notes = {"job_seconds": round(time.time() - start, 1), "job_exit": done.returncode}
    if done.returncode != 0:
        notes["job_error"] = log.read_text(errors="replace").strip().splitlines()[-3:]
    return Window("nightly run", start, time.time(), notes)


def pushes(url: str, token: str, clients: int, seconds: float, entities: int) -> Window:
    """``clients`` pushing 10 rows at a time as fast as they are answered (0.1 s after a 503, as
    a client that retries backs off), for ``seconds``, to a source the load does not read: more
    than the server's push limit, so some are refused while the limit's worth write. The
    reads' errors and p99 in this window are the measure."""
    import http.client
    import json
    import random
    from datetime import UTC, datetime
    from urllib.parse import urlsplit

    from bench.soak.data import PUSH_SOURCE

    parts = urlsplit(url)
    answers: dict[str, int] = {}
    lock = threading.Lock()
    stop = time.time() + seconds

    def push(seed: int) -> None:
        rng, conn = random.Random(seed), http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
        while time.time() < stop:
            ids = rng.sample(range(entities), 10)
            now = datetime.now(UTC).isoformat()
            df = {"entity_id": ids, "event_timestamp": [now] * 10, "p": [rng.random() for _ in ids]}
            try:
                conn.request("POST", "/push", json.dumps({"push_source_name": PUSH_SOURCE, "df": df}), headers)
                response = conn.getresponse()
                response.read()
                status = str(response.status)
            except OSError as exc:
                status = type(exc).__name__
                conn.close()
            with lock:
                answers[status] = answers.get(status, 0) + 1
            if status == "503":  # refused at the limit: back off, as a client that retries should
                time.sleep(0.1)

    start, busy = time.time(), _cpu_ticks()
    threads = [threading.Thread(target=push, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    used, total = (b - a for a, b in zip(busy, _cpu_ticks()))
    notes = {"pushers": clients, "push_answers": answers, "machine_cpu_busy": round(used / total, 3) if total else None}
    return Window("pushes saturated", start, time.time(), notes)


def _cpu_ticks() -> tuple[int, int]:
    """The machine's CPU ticks (busy, all) so far, from /proc/stat: how much of both cores a window used."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return sum(values) - idle, sum(values)


HEAD = b"POST /get-online-features HTTP/1.1\r\nHost: soak\r\nContent-Type: application/json\r\n"


def slow_clients(port: int, count: int, seconds: float) -> Window:
    """``count`` connections for ``seconds``: a third trickle their headers (a line a second),
    a third send their headers and half a body then hold, a third connect and send nothing.
    Notes how many the server had closed by the end (a server that bounds them closes them)."""
    start = time.time()
    conns: list[tuple[int, socket.socket]] = []
    refused = 0
    for i in range(count):
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            refused += 1
            continue
        kind = i % 3
        try:
            if kind == 0:
                s.sendall(HEAD)
            elif kind == 1:
                s.sendall(HEAD + b"Content-Length: 2000\r\n\r\n" + b'{"features": ["bench_standard:f00"], "entities"')
        except OSError:
            pass
        conns.append((kind, s))
    stop = threading.Event()
    closed = set()

    def trickle() -> None:
        n = 0
        while not stop.wait(1.0):
            n += 1
            for j, (kind, s) in enumerate(conns):
                if kind == 0 and j not in closed:
                    try:
                        s.sendall(b"X-Slow-%d: 1\r\n" % n)
                    except OSError:
                        closed.add(j)

    worker = threading.Thread(target=trickle, daemon=True)
    worker.start()
    time.sleep(seconds)
    stop.set()
    worker.join()
    for j, (_, s) in enumerate(conns):
        s.setblocking(False)
        try:
            s.recv(1)  # an answer (408, 400) or the end of the stream: the server let it go
            closed.add(j)
        except BlockingIOError:
            pass
        except OSError:
            closed.add(j)
        s.close()
    return Window(
        "200 slow clients" if count == 200 else f"{count} slow clients", start, time.time(),
        {"clients": count, "refused_at_connect": refused, "closed_by_server": len(closed), "held_seconds": seconds},
    )  # fmt: skip


@dataclass
class Hostile:
    """The hostile phase's parameters (Plan.hostile)."""

    seconds: float = 40.0
    holders: int = 4
    """Token holders sending refused bodies at the server's limits; half hold a token granting nothing, half one granting another source."""
    rate: float = 2.0
    """Refused bodies per second per holder."""
    non_readers: int = 32
    depth: int = 100
    """Requests each non-reading client pipelines (each for a 100 x 50 answer)."""
    trickle: float = 1.0
    """Seconds between the JWKS's bytes while the phase lasts."""


def hostile(url: str, idp, signer, entities: int, h: Hostile, write_deadline: float) -> Window:
    """For ``h.seconds`` at once: refused huge requests from token holders, clients that
    pipeline and never read, and the JWKS trickling (fresh tokens probed meanwhile); then
    the JWKS answers at once again. Notes what each met."""
    from bench.soak import hostile as clients
    from bench.soak.data import features
    from bench.soak.idp import NOBODY, OTHER, READER

    port, names = int(url.rsplit(":", 1)[1]), features()
    non_readers = clients.NonReaders(port, signer.token([READER]), names, entities, h.non_readers, h.depth)
    refused: dict = {}
    probed: dict = {}
    stop = threading.Event()
    threads = [threading.Thread(target=clients.send_refused, args=(port, i, signer.token([(NOBODY, OTHER)[i % 2]]), h.rate, stop, refused))
               for i in range(h.holders)]  # fmt: skip
    threads += [threading.Thread(target=non_readers.run, args=(stop,)),
                threading.Thread(target=clients.probe_fresh_tokens, args=(url, signer, READER, names, stop, probed))]  # fmt: skip
    start = time.time()
    idp.trickle = h.trickle
    try:
        for t in threads:
            t.start()
        time.sleep(h.seconds)
    finally:
        stop.set()
        for t in threads:
            t.join()
        idp.trickle = None
    back = time.time()
    fetches = [f for f in idp.fetches if start <= f[0] < back]
    notes = {
        "seconds": h.seconds, "holders": h.holders, "refused_answers": refused,
        **non_readers.notes(write_deadline),
        "fresh_tokens_while_trickling": probed, "jwks_trickle_seconds_per_byte": h.trickle,
        "jwks_fetches_in_window": len(fetches), "jwks_fetches_whole": sum(1 for f in fetches if f[3]),
        "jwks_fetch_longest_seconds": round(max((f[1] - f[0] for f in fetches), default=0.0), 2),
    }  # fmt: skip
    return Window("hostile clients", start, back, notes)
