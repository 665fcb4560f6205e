"""`materialize serve` in a process of its own, for the tests that speak to it over HTTP, and
the settings of a test server over a conf the job wrote."""

from __future__ import annotations

import copy
import http.client
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from throwaway.servers import again_if_port_taken, free_port, start_failed

from .confs import env_conf

MATERIALIZE = str(Path(sys.executable).parent / "materialize")


def server_settings(conf, **extra) -> dict:
    """Settings for a test server; ``extra`` is copied, so a test that updates its settings leaves shared
    constants alone (one did: every later test in the module ran with its 1 MiB unsent bound)."""
    extra = copy.deepcopy(extra)
    return {
        "definitions_dir": conf.definitions_dir, "sinks": ["redis", "sql"],
        "redis": {"url": conf.redis.url, "password_env": None, "mode": "standalone"}, "sql": {"dsn": conf.sql.dsn, "password_env": None},
        "reader": {"max_entities": 5, "timeout_ms": 5000}, "server": {"max_body_bytes": 4096},
        **extra,
    }  # fmt: skip


class Served:
    def __init__(self, port: int, process: subprocess.Popen, log: Path):
        self.port, self.process, self.log = port, process, log

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 30) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers={"content-type": "application/json"} if body is not None else {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def post(self, payload: dict | bytes) -> tuple[int, bytes]:
        return self.request("POST", "/get-online-features", payload if isinstance(payload, bytes) else json.dumps(payload).encode())

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def serve(tmp: Path, env: str, settings: dict, password: str | None = None, workers: int = 1) -> Served:
    """`materialize serve` in a process of its own, on a conf folder of its own; returned once /health answers."""
    folder = env_conf(tmp / f"conf-{env}", env, json.dumps(settings))
    environ = {**os.environ, "FM_CONF_DIR": str(folder)}
    if password:
        environ["TEST_REDIS_PASSWORD"] = password
    return start_serving([MATERIALIZE, "serve", "--env", env, "--workers", str(workers)], environ, tmp / f"serve-{env}.log")


def start_serving(command: list[str], environ: dict[str, str], log: Path, cwd: Path | None = None, served_as=Served):
    """``command --port P`` on a free port (another if that one was taken first), once /health
    answers; ``served_as(port, process, log)`` is what is returned (its ``request`` asks /health)."""

    def start(port: int):
        process = subprocess.Popen([*command, "--port", str(port)], stdout=log.open("wb"), stderr=subprocess.STDOUT, env=environ, cwd=cwd)
        served = served_as(port, process, log)
        deadline = time.monotonic() + 60
        while process.poll() is None:
            try:
                served.request("GET", "/health", timeout=2)
                return served
            except OSError:
                assert time.monotonic() < deadline, f"the server never answered: {log.read_text()}"
                time.sleep(0.2)
        raise start_failed(f"the server exited: {log.read_text()}", log)

    return again_if_port_taken(lambda: start(free_port()))
