"""Throwaway servers on free loopback ports, for the tests and the benchmarks alike:
redis-server and PostgreSQL here, Redis Cluster in cluster.py. Development tooling:
the product never imports it (it is not in the wheel).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import psycopg
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, db: int = 0) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, db=db)

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def start_redis(tmp: Path, *args: str, port: int | None = None) -> RedisServer:
    """A real redis-server on a free loopback port, or on ``port`` (no automatic saves; a
    dump.rdb in ``tmp`` is loaded at start, so a server shut down with SAVE can come back)."""
    binary = shutil.which("redis-server")
    assert binary, "redis-server is not installed: run `make setup` (scripts/setup.sh installs it)"
    tmp.mkdir(parents=True, exist_ok=True)
    log = Path(args[args.index("--logfile") + 1]) if "--logfile" in args else tmp / "redis.out"

    def start(chosen: int) -> RedisServer:
        with open(tmp / "redis.out", "wb") as out:
            process = subprocess.Popen(
                [binary, "--port", str(chosen), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        server = RedisServer(chosen, process)
        wait_for_redis(process, server.client, f"redis-server on port {chosen}", log)
        return server

    if port:  # asked for: no other will do
        return start(port)
    return again_if_port_taken(lambda: start(free_port()))


PORT_ATTEMPTS = 5


class PortTaken(RuntimeError):
    """A server could not bind a port found free: something took it in between (the kernel
    hands the same range to outgoing connections as source ports)."""


def again_if_port_taken(start: Callable[[], T]) -> T:
    """``start()``, which picks its ports; again, on others, while it raises PortTaken."""
    for attempt in range(PORT_ATTEMPTS):
        try:
            return start()
        except PortTaken:
            if attempt == PORT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def start_failed(what: str, log: Path) -> RuntimeError:
    """The error for a server that did not start: PortTaken when its log says its address
    is in use (redis-server, PostgreSQL and uvicorn all say so)."""
    try:
        taken = "address already in use" in log.read_text(errors="replace").lower()
    except FileNotFoundError:
        taken = False
    return (PortTaken if taken else RuntimeError)(f"{what}: see {log}")


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports whose port+10000 (a cluster bus) is free too."""
    found: list[int] = []
    while len(found) < n:
        port = free_port()
        if port + 10000 > 65535 or port in found:
            continue
        with socket.socket() as bus:
            try:
                bus.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        found.append(port)
    return found


def wait_for_redis(process: subprocess.Popen, client: Callable[[], redis.Redis], what: str, log: Path) -> None:
    """Until the server answers a PING (or asks for a password); kill it if it never does."""
    deadline = time.monotonic() + 10
    while True:
        probe = client()
        probe.set_retry(Retry(NoBackoff(), 0))  # this loop retries; redis-py's own backoff would wait seconds on a server that exited
        try:
            probe.ping()
            return
        except (redis.AuthenticationError, redis.ResponseError):
            return  # up, and asks for a password (--requirepass)
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise start_failed(f"{what} did not start (exit {process.poll()})", log) from None
            time.sleep(0.05)


@dataclass
class PostgresServer:
    port: int
    data_dir: Path
    bin_dir: Path
    database: str = "features"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=True)

    def stop(self) -> None:
        _as_postgres([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)


def _as_postgres(cmd: list[str]) -> subprocess.CompletedProcess:
    # initdb and postgres refuse to run as root: run them as the 'postgres' system user then.
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def start_postgres(prepare: Callable[[Path], str] | None = None) -> PostgresServer:
    """A throwaway PostgreSQL cluster (initdb in a temp dir) on a free loopback port.

    ``prepare(root)`` runs after initdb, before the start: it may put files in ``root`` (the
    postgres user reads it; the cluster is ``root/data``) and returns further server options."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    assert found, "PostgreSQL is not installed: run `make setup` (scripts/setup.sh installs it)"
    bin_dir = Path(found[-1]).parent
    # Not under pytest's tmp dir: that one is private to root, and the server runs as postgres.
    root = Path(tempfile.mkdtemp(prefix="fm-test-pg-"))
    data = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    out = _as_postgres([str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C.UTF-8"])
    assert out.returncode == 0, f"initdb failed: {out.stderr}"
    options = prepare(root) if prepare else ""
    log = data / "server.log"

    def start() -> int:
        port = free_port()
        log.unlink(missing_ok=True)  # pg_ctl appends: an earlier attempt's lines are not this one's
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40 {options}"
        out = _as_postgres([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "start"])
        if out.returncode != 0:
            raise start_failed(f"PostgreSQL did not start on port {port}: {out.stdout} {out.stderr}", log)
        return port

    port = again_if_port_taken(start)
    server = PostgresServer(port, data, bin_dir)
    # over the Unix socket: pg_hba may refuse plain TCP (a TLS-only server)
    with psycopg.connect(host=str(root), port=port, user="postgres", dbname="postgres", autocommit=True) as conn:
        conn.execute("CREATE DATABASE features")
    return server


MOTO_VENV = Path(__file__).resolve().parent.parent / ".run" / "moto-venv"


@dataclass
class S3Server:
    """An S3-compatible server (moto's server mode) on a free loopback port."""

    port: int
    process: subprocess.Popen

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def create_bucket(self, name: str) -> None:
        # moto does not check request signatures: a plain PUT creates the bucket
        request = urllib.request.Request(f"{self.endpoint}/{name}", method="PUT")
        urllib.request.urlopen(request, timeout=10).close()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def start_s3(log: Path) -> S3Server:
    binary = MOTO_VENV / "bin" / "moto_server"
    assert binary.exists(), f"the S3 test server is not installed ({binary}): run `bash scripts/setup.sh --test` (make test does)"
    port = free_port()
    with open(log, "wb") as out:
        process = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT)
    server = S3Server(port, process)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{server.endpoint}/moto-api/", timeout=2).close()
            return server
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.process.kill()
                raise RuntimeError(f"moto_server did not start on port {port}: see {log}") from None
            time.sleep(0.2)


@dataclass
class Pushgateway:
    """Prometheus's Pushgateway (Debian's prometheus-pushgateway) on a free loopback port."""

    port: int
    process: subprocess.Popen

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> str:
        """What Prometheus would scrape from it (Prometheus text)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as answer:
            return answer.read().decode()

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


def start_pushgateway(log: Path) -> Pushgateway:
    binary = shutil.which("prometheus-pushgateway")
    assert binary, "prometheus-pushgateway is not installed: run `bash scripts/setup.sh --test` (make test does)"

    def start() -> Pushgateway:
        port = free_port()
        with open(log, "wb") as out:
            process = subprocess.Popen([binary, f"--web.listen-address=127.0.0.1:{port}"], stdout=out, stderr=subprocess.STDOUT)
        server = Pushgateway(port, process)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{server.url}/-/ready", timeout=2).close()
                return server
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    process.kill()
                    raise start_failed(f"prometheus-pushgateway did not start on port {port}", log) from None
                time.sleep(0.1)

    return again_if_port_taken(start)


def restart_redis(server: RedisServer, tmp: Path, *args: str, down: float = 0.0) -> RedisServer:
    """Stop ``server`` (SIGTERM: with --appendonly yes it flushes its log first), wait ``down``
    seconds, and start it again on the same port with ``args``: what it persisted comes back."""
    server.stop()
    time.sleep(down)
    return start_redis(tmp, *args, port=server.port)


def restart_postgres(server: PostgresServer, down: float = 0.0) -> None:
    """Stop ``server`` (fast shutdown: sessions are cut), wait ``down`` seconds, start it again
    with the options it ran with (pg_ctl restart reads them from postmaster.opts)."""
    pg_ctl = str(server.bin_dir / "pg_ctl")
    out = _as_postgres([pg_ctl, "-D", str(server.data_dir), "-m", "fast", "-w", "stop"])
    assert out.returncode == 0, f"PostgreSQL did not stop: {out.stdout} {out.stderr}"
    time.sleep(down)
    log = server.data_dir / "server.log"
    out = _as_postgres([pg_ctl, "-D", str(server.data_dir), "-l", str(log), "-w", "restart"])
    assert out.returncode == 0, f"PostgreSQL did not start again: {out.stdout} {out.stderr}"
