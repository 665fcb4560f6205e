"""The open health routes of `materialize serve` with bearer tokens on: a caller without a
valid token learns each store's status only; a caller whose token verifies, and the log,
learn why a store does not answer (a real server process, a real Redis stopped and started)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

from throwaway.servers import start_redis

from .support.confs import env_conf
from .support.serving import MATERIALIZE, start_serving

ISSUER, AUDIENCE = "https://idp.test", "feature-server"


class _Signer:
    def __init__(self):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.jwk = {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key())), "kid": "k1", "use": "sig", "alg": "ES256"}

    def token(self) -> str:
        now = int(time.time())
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "ops", "iat": now, "exp": now + 600, "roles": ["ops"]}
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": "k1"})


class _Served:
    def __init__(self, port, process, log):
        self.port, self.process, self.log = port, process, log

    def request(self, method: str, path: str, token: str | None = None, timeout: float = 30) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, headers={"authorization": f"Bearer {token}"} if token else {})
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()


def gauges(served: _Served) -> dict[str, float]:
    """The health gauges of /metrics: sample -> value."""
    status, body = served.request("GET", "/metrics")
    assert status == 200
    wanted = ("feature_server_ready", "feature_server_store_up", "feature_server_undescribed")
    return {name: float(value) for name, value in (line.rsplit(" ", 1) for line in body.decode().splitlines() if line.startswith(wanted))}


def test_open_health_routes_say_a_stores_status_and_keep_why_for_tokens_and_the_log(tmp_path):
    redis = start_redis(tmp_path / "redis")
    ours, stranger = _Signer(), _Signer()
    (tmp_path / "jwks.json").write_text(json.dumps({"keys": [ours.jwk]}))
    auth = {"mode": "jwt", "jwks_file": str(tmp_path / "jwks.json"), "issuer": ISSUER, "audience": [AUDIENCE],
            "grants": {"ops": {"sources": ["*"]}}}  # fmt: skip
    settings = {"sinks": ["redis"], "redis": {"url": redis.url, "password_env": None, "mode": "standalone"},
                "server": {"auth": auth, "health_cache_ms": 0}}  # fmt: skip
    environ = {**os.environ, "FM_CONF_DIR": str(env_conf(tmp_path / "conf", "t", json.dumps(settings)))}
    served = start_serving([MATERIALIZE, "serve", "--env", "t"], environ, tmp_path / "serve.log", served_as=_Served)
    address = f"127.0.0.1:{redis.port}"
    try:
        assert served.request("GET", "/health") == (200, b'{"status":"ready","stores":{"redis":"ok"}}')
        # nothing written yet: Redis describes neither entity type of the definitions (consumer, store)
        undescribed = {'feature_server_undescribed_entity_types{store="redis"}': 2.0}
        assert gauges(served) == {"feature_server_ready": 1.0, 'feature_server_store_up{store="redis"}': 1.0, **undescribed}
        redis.stop()
        # a scrape checks the stores as a probe does (the alert rules read these): Redis down, not ready
        assert gauges(served) == {"feature_server_ready": 0.0, 'feature_server_store_up{store="redis"}': 0.0, **undescribed}
        unavailable = (503, b'{"status":"unavailable","stores":{"redis":"unavailable"}}')
        for path in ("/health", "/health/ready"):
            assert served.request("GET", path) == unavailable
            assert served.request("GET", path, token=stranger.token()) == unavailable  # a token that does not verify: the open answer
        status, body = served.request("GET", "/health", token=ours.token())
        assert status == 503 and address in json.loads(body)["stores"]["redis"]
        log = served.log.read_text()
        # the reason is logged once, however many probes saw it
        assert [line for line in log.splitlines() if "store redis does not answer" in line and address in line] != []
        assert log.count("store redis does not answer") == 1, log
        redis = start_redis(tmp_path / "redis", port=redis.port)
        assert served.request("GET", "/health") == (200, b'{"status":"ready","stores":{"redis":"ok"}}')
        assert "store redis answers again" in served.log.read_text()
        assert gauges(served) == {"feature_server_ready": 1.0, 'feature_server_store_up{store="redis"}': 1.0, **undescribed}
    finally:
        served.process.send_signal(signal.SIGTERM)
        served.process.wait(timeout=30)
        redis.stop()
