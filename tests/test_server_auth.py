"""`materialize serve` with HTTPS (certificates made here, optional client certificates) and
bearer-token authentication (JWTs signed here, keys from a JWKS file or URL), as a real
server process over the suite's Redis: https works and plain http on that port does not, a
client certificate is required when configured, a missing/bad/expired token gets 401 with
WWW-Authenticate saying which, a token gets only what its claims grant (403 naming the
rest), and the server refuses to start unauthenticated on a non-loopback address."""

from __future__ import annotations

import datetime as dt
import http.client
import http.server
import ipaddress
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import jwt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from throwaway.servers import again_if_port_taken, free_port, start_failed

from .support.confs import env_conf
from .support.serving import MATERIALIZE, start_serving
from .support.tls import builder, make_ca, make_server_cert, pem, pem_key
from .support.tokens import AUDIENCE, ISSUER, Signer, jwks_of

RANKING = {"feature_service": "consumer_ranking", "entities": {"consumer_id": [1, 2]}}
STORES = {"features": ["store_features_long:rating_avg_30d"], "entities": {"store_id": ["s7"]}}
BOTH = {
    "features": ["store_features_long:rating_avg_30d", "consumer_daily:orders_7d"],
    "entities": {"store_id": ["s7"], "consumer_id": [1]},
}
GRANTS = {
    "ranking-model": {"feature_services": ["consumer_ranking"]},
    "store-model": {"sources": ["store_features_long"]},
    "analyst": {"sources": ["*"], "feature_services": ["*"]},
}


# --- certificates and keys ------------------------------------------------------------------


@dataclass
class Pki:
    ca: Path
    other_ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path


def _client_cert(ca_key, ca_cert):
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        builder("fm-test-client", ca_cert.subject, key)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    ca_key, ca_cert = make_ca("fm serve CA")
    _, other = make_ca("fm unrelated CA")
    key, cert = make_server_cert(ca_key, ca_cert, [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    client_key, client_cert = _client_cert(ca_key, ca_cert)
    files = {"ca.pem": pem(ca_cert), "other.pem": pem(other), "server.pem": pem(cert), "server.key": pem_key(key),
             "client.pem": pem(client_cert), "client.key": pem_key(client_key)}  # fmt: skip
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return Pki(*(folder / n for n in ("ca.pem", "other.pem", "server.pem", "server.key", "client.pem", "client.key")))


@pytest.fixture(scope="module")
def signer() -> Signer:
    return Signer("k1")


# --- a server process --------------------------------------------------------------------


class Https:
    def __init__(self, port: int, process: subprocess.Popen, log: Path, context: ssl.SSLContext | None):
        self.port, self.process, self.log, self.context = port, process, log, context

    def request(self, method: str, path: str, body: dict | None = None, token: str | None = None, context=None, timeout: float = 30):
        if self.context is None and context is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=context or self.context)
        headers = {"content-type": "application/json"} | ({"authorization": f"Bearer {token}"} if token else {})
        try:
            conn.request(method, path, body=json.dumps(body).encode() if body is not None else None, headers=headers)
            response = conn.getresponse()
            return response.status, response.read(), dict(response.getheaders())
        finally:
            conn.close()

    def post(self, body: dict, token: str | None = None, **kw):
        return self.request("POST", "/get-online-features", body, token, **kw)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


def _settings(redis_server, db: int, **server) -> dict:
    url = redis_server.url.rsplit("/", 1)[0] + f"/{db}"
    return {"sinks": ["redis"], "redis": {"url": url, "password_env": None, "mode": "standalone"}, "server": server}


def start(tmp: Path, settings: dict, context: ssl.SSLContext | None, *args: str) -> Https:
    folder = env_conf(tmp / f"conf-{len(list(tmp.glob('conf-*')))}", "t", json.dumps(settings))
    environ = {**os.environ, "FM_CONF_DIR": str(folder)}
    log = tmp / f"serve-{folder.name}.log"

    command = [MATERIALIZE, "serve", "--env", "t", *args]
    return start_serving(command, environ, log, served_as=lambda port, process, log: Https(port, process, log, context))


def _trusting(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca))
    if cert:
        context.load_cert_chain(str(cert), str(key))
    return context


def _names(body: bytes) -> list[str]:
    return json.loads(body)["metadata"]["feature_names"]


# --- TLS ------------------------------------------------------------------------------------


def test_https_answers_and_plain_http_on_its_port_gets_nothing(pki, redis_server, tmp_path):
    tls = {"cert_file": str(pki.cert), "key_file": str(pki.key)}
    served = start(tmp_path, _settings(redis_server, 11, tls=tls), _trusting(pki.ca))
    try:
        status, body, _ = served.post(RANKING)
        assert status == 200 and _names(body) == ["consumer_id", "orders_7d", "churn_score", "is_subscriber", "taste_embedding"]
        assert served.request("GET", "/metrics")[0] == 200
        with pytest.raises((http.client.HTTPException, OSError)):  # a TLS port: no HTTP answer to plain text
            _plain(served.port)
        with pytest.raises(ssl.SSLCertVerificationError):  # the certificate is the configured one, signed by our CA
            served.request("GET", "/health", context=_trusting(pki.other_ca))
        assert "https://" in served.log.read_text()
    finally:
        assert served.stop() == -signal.SIGTERM


def _plain(port: int):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().read()
    finally:
        conn.close()


def test_a_client_certificate_is_required_when_a_client_ca_is_set(pki, redis_server, tmp_path):
    tls = {"cert_file": str(pki.cert), "key_file": str(pki.key), "client_ca_file": str(pki.ca)}
    with_cert = _trusting(pki.ca, pki.client_cert, pki.client_key)
    served = start(tmp_path, _settings(redis_server, 11, tls=tls), with_cert)
    try:
        status, body, _ = served.post(RANKING)
        assert status == 200 and _names(body)[0] == "consumer_id"
        with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):  # TLS 1.3: refused at the first read
            served.request("GET", "/health", context=_trusting(pki.ca))
        # a certificate from another CA is refused too
        other_key, other_cert = _client_cert(*make_ca("fm other client CA"))
        (tmp_path / "o.pem").write_bytes(pem(other_cert))
        (tmp_path / "o.key").write_bytes(pem_key(other_key))
        with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
            served.request("GET", "/health", context=_trusting(pki.ca, tmp_path / "o.pem", tmp_path / "o.key"))
    finally:
        assert served.stop() == -signal.SIGTERM


@pytest.mark.parametrize(
    "tls, text",
    [
        ({"cert_file": "missing.pem", "key_file": "missing.key"}, "server.tls: {root}/missing.pem: No such file or directory"),
        ({"cert_file": "{key}", "key_file": "{key}"}, "not a PEM certificate"),
        ({"cert_file": "{cert}", "key_file": "{client_key}"}, "is not the key of the certificate"),
    ],
)
def test_bad_tls_files_stop_the_start_naming_the_file(pki, redis_server, tmp_path, tls, text):
    names = {"key": pki.key, "cert": pki.cert, "client_key": pki.client_key}
    tls = {k: v.format(**names) for k, v in tls.items()}
    folder = env_conf(tmp_path / "conf", "t", json.dumps(_settings(redis_server, 11, tls=tls)))
    done = subprocess.run([MATERIALIZE, "serve", "--env", "t", "--port", "1"], env={**os.environ, "FM_CONF_DIR": str(folder)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    from fm_config import PROJECT_ROOT

    assert done.returncode == 2 and text.format(root=PROJECT_ROOT) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# --- tokens ----------------------------------------------------------------------------------


def _auth(jwks: dict, **extra) -> dict:
    return {"mode": "jwt", **jwks, "issuer": ISSUER, "audience": [AUDIENCE], "grants": GRANTS, "leeway_seconds": 30, **extra}


@pytest.fixture(scope="module")
def jwt_served(signer, redis_server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jwt")
    (tmp / "jwks.json").write_bytes(jwks_of(signer))
    served = start(tmp, _settings(redis_server, 11, auth=_auth({"jwks_file": str(tmp / "jwks.json")})), None)
    yield served
    assert served.stop() == -signal.SIGTERM


def _refused(answer, status: int, text: str, token: str | None = None, error: str | None = "invalid_token"):
    got, body, headers = answer
    assert got == status, body
    assert text in json.loads(body)["error"], body
    if token:
        assert token not in body.decode() and token.split(".")[1] not in body.decode()  # never echoed
    if status == 401:
        challenge = headers["www-authenticate"]
        assert challenge.startswith('Bearer realm="feature-server"')
        assert (f'error="{error}"' in challenge) if error else ("error=" not in challenge)


def test_a_read_without_a_good_token_gets_401_saying_why(jwt_served, signer):
    _refused(jwt_served.post(RANKING), 401, "needs a bearer token", error=None)
    expired = signer.token(["analyst"], exp_in=-120)
    _refused(jwt_served.post(RANKING, expired), 401, "the token has expired", expired)
    _refused(jwt_served.post(RANKING, signer.token(["analyst"], iss="https://evil.test")), 401, "not from the accepted issuer")
    _refused(jwt_served.post(RANKING, signer.token(["analyst"], aud="another-service")), 401, "not for this server")
    forged = Signer("k1").token(["analyst"])  # the right key id, another key
    _refused(jwt_served.post(RANKING, forged), 401, "signature does not verify", forged)
    _refused(jwt_served.post(RANKING, Signer("k9").token(["analyst"])), 401, "key id 'k9' is not in the JWKS")
    _refused(jwt_served.post(RANKING, "not-a-jwt"), 401, "is not a JWT")
    unsigned = jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 600, "roles": ["analyst"]}, None, algorithm="none")
    _refused(jwt_served.post(RANKING, unsigned), 401, "algorithm 'none' is not accepted")
    # HS256 with the public key as the secret (the key-confusion attack)
    public_pem = signer.key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    claims = {"iss": ISSUER, "aud": AUDIENCE, "exp": int(time.time()) + 600, "roles": ["analyst"]}
    confused = _hs256(claims, public_pem)
    _refused(jwt_served.post(RANKING, confused), 401, "algorithm 'HS256' is not accepted")
    health = jwt_served.request("GET", "/health")  # probes send no token (503: a store ping slow on a busy machine, not auth)
    assert health[0] in (200, 503) and "www-authenticate" not in health[2], health
    status, metrics, _ = jwt_served.request("GET", "/metrics")
    assert status == 200 and b"feature_server_auth_tokens_refused_total 9.0" in metrics


def _hs256(claims: dict, secret: bytes) -> str:
    """An HS256 token made by hand (PyJWT itself refuses a PEM public key as an HMAC secret)."""
    import base64
    import hashlib
    import hmac

    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    signing = part(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode()) + "." + part(json.dumps(claims).encode())
    return signing + "." + part(hmac.new(secret, signing.encode(), hashlib.sha256).digest())


def test_a_token_reads_only_what_its_claims_grant(jwt_served, signer):
    ranking = signer.token(["ranking-model"])
    status, body, _ = jwt_served.post(RANKING, ranking)
    assert status == 200 and _names(body) == ["consumer_id", "orders_7d", "churn_score", "is_subscriber", "taste_embedding"]
    _refused(jwt_served.post({"features": ["consumer_daily:orders_7d"], "entities": {"consumer_id": [1]}}, ranking), 403,
             "does not grant reading source 'consumer_daily'")  # fmt: skip
    stores = signer.token(["store-model"])
    assert jwt_served.post(STORES, stores)[0] == 200
    _refused(jwt_served.post(BOTH, stores), 403, "does not grant reading source 'consumer_daily' (server.auth.grants)")
    _refused(jwt_served.post(RANKING, stores), 403, "feature service 'consumer_ranking'")
    _refused(jwt_served.post(RANKING, signer.token(["nobody"])), 403, "feature service 'consumer_ranking'")
    # a space-separated claim (OAuth's scope) under another name is read the same way: not here, roles is the claim
    _refused(jwt_served.post(RANKING, signer.token("analyst", claim="scope")), 403, "feature service 'consumer_ranking'")
    analyst = signer.token("ranking-model analyst")  # a string claim: space-separated values
    assert jwt_served.post(BOTH, analyst)[0] == 200
    # within the leeway an expired token still reads; the same token again comes from the cache
    late = signer.token(["analyst"], exp_in=-5)
    assert [jwt_served.post(BOTH, late)[0] for _ in range(3)] == [200] * 3
    metrics = jwt_served.request("GET", "/metrics")[1].decode()
    # reused: ranking once, stores twice, late twice (the other test's tokens were all refused, never cached)
    assert "\nfeature_server_auth_tokens_cached_total 5.0\n" in metrics


def test_keys_from_a_url_are_refreshed_and_kept_while_it_is_down(signer, redis_server, tmp_path):
    jwks = {"body": jwks_of(signer)}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(jwks["body"])

        def log_message(self, *args):
            pass

    idp = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=idp.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{idp.server_address[1]}/jwks"
    served = start(tmp_path, _settings(redis_server, 11, auth=_auth({"jwks_url": url}, jwks_refresh_seconds=1)), None)
    try:
        assert served.post(RANKING, signer.token(["analyst"]))[0] == 200
        rotated = Signer("k2")
        jwks["body"] = jwks_of(signer, rotated)
        time.sleep(1.2)
        assert served.post(RANKING, rotated.token(["analyst"]))[0] == 200  # an unknown key id fetched the keys again
        idp.shutdown()
        idp.server_close()
        time.sleep(1.2)
        fresh = signer.token(["analyst"], exp_in=900)  # not cached: verified with the keys kept
        assert served.post(RANKING, fresh)[0] == 200
        assert served.post(RANKING, fresh)[0] == 200
    finally:
        assert served.stop() == -signal.SIGTERM


def test_keys_that_cannot_be_fetched_at_start_answer_503_not_401(signer, redis_server, tmp_path):
    url = f"http://127.0.0.1:{free_port()}/jwks"  # nothing listens
    served = start(tmp_path, _settings(redis_server, 11, auth=_auth({"jwks_url": url})), None)
    try:
        status, body, _ = served.post(RANKING, signer.token(["analyst"]))
        assert status == 503 and "cannot verify tokens: the JWKS at " + url in json.loads(body)["error"]
    finally:
        assert served.stop() == -signal.SIGTERM


# --- start-up ----------------------------------------------------------------------------------


def test_serve_refuses_to_start_unauthenticated_on_a_non_loopback_address(redis_server, tmp_path):
    folder = env_conf(tmp_path / "conf", "t", json.dumps(_settings(redis_server, 11)))
    environ = {**os.environ, "FM_CONF_DIR": str(folder)}
    done = subprocess.run([MATERIALIZE, "serve", "--env", "t", "--host", "0.0.0.0", "--port", "1"], env=environ,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "refusing to serve features without authentication on 0.0.0.0" in done.stderr
    assert "server.auth.mode: none" in done.stderr and "--insecure-no-auth" in done.stderr and "Traceback" not in done.stderr
    served = start(tmp_path / "insecure", _settings(redis_server, 11), None, "--host", "0.0.0.0", "--insecure-no-auth")
    try:
        assert served.post(RANKING)[0] == 200
    finally:
        assert served.stop() == -signal.SIGTERM


@pytest.mark.parametrize(
    "auth, text",
    [
        ({"mode": "jwt", "jwks_file": "x.json", "issuer": ISSUER, "audience": [AUDIENCE], "grants": GRANTS, "algorithms": ["HS256"]},
         "HS256 refused (asymmetric only"),
        ({"mode": "jwt", "jwks_file": "x.json", "issuer": ISSUER, "audience": [AUDIENCE], "grants": GRANTS, "algorithms": ["none"]},
         "none refused"),
        ({"mode": "jwt", "jwks_file": "x.json", "grants": GRANTS}, "needs issuer and audience"),
        ({"mode": "jwt", "jwks_file": "/nonexistent/jwks.json", "issuer": ISSUER, "audience": [AUDIENCE], "grants": GRANTS},
         "server.auth.jwks_file /nonexistent/jwks.json: No such file or directory"),
    ],
)  # fmt: skip
def test_bad_auth_settings_stop_the_start_naming_the_setting(redis_server, tmp_path, auth, text):
    folder = env_conf(tmp_path / "conf", "t", json.dumps(_settings(redis_server, 11, auth=auth)))
    done = subprocess.run([MATERIALIZE, "serve", "--env", "t", "--port", "1"], env={**os.environ, "FM_CONF_DIR": str(folder)},
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and text in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_cached_token_expires_with_the_token(signer, tmp_path):
    """In process: the cache answers until exp + leeway, then the token is verified again (and refused)."""
    import asyncio

    from feature_defs import DEFAULT_DIR, load_definitions
    from feature_reader.auth import Authenticator, AuthError
    from fm_config.reader import ServerAuthSettings

    path = tmp_path / "jwks.json"
    path.write_bytes(jwks_of(signer))
    settings = ServerAuthSettings(**_auth({"jwks_file": str(path)}, cache_entries=2))
    now = [time.time()]
    auth = Authenticator(settings, load_definitions(DEFAULT_DIR), Path, clock=lambda: now[0])
    token = signer.token(["analyst"], exp_in=60)
    header = [(b"authorization", f"Bearer {token}".encode())]
    asyncio.run(auth.authenticate("/get-online-features", header))
    asyncio.run(auth.authenticate("/get-online-features", header))
    assert auth.stats == {"verified": 1, "cached": 1, "refused": 0}
    now[0] += 60 + 31  # past exp and the leeway by the cache's clock: verified again (PyJWT checks on real time)
    asyncio.run(auth.authenticate("/get-online-features", header))
    assert auth.stats["verified"] == 2
    for roles in (["a"], ["b"], ["c"]):  # bounded: two entries at most
        asyncio.run(auth.authenticate("/get-online-features", [(b"authorization", f"Bearer {signer.token(roles)}".encode())]))
    assert len(auth.cache) == 2
    with pytest.raises(AuthError):
        asyncio.run(auth.authenticate("/get-online-features", [(b"authorization", b"Basic abc")]))


def test_a_token_whose_algorithm_does_not_fit_its_key_gets_401(signer, tmp_path):
    """In process: a JWKS key without "alg" (common) and a token naming another accepted
    algorithm for its kid (ES256 on an RSA key): PyJWT raises TypeError, once a 500."""
    import asyncio

    from cryptography.hazmat.primitives.asymmetric import rsa

    from feature_defs import DEFAULT_DIR, load_definitions
    from feature_reader.auth import Authenticator, AuthError
    from fm_config.reader import ServerAuthSettings

    rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(rsa.generate_private_key(65537, 2048).public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**rsa_jwk, "kid": "r1", "use": "sig"}]}))  # no "alg"
    auth = Authenticator(ServerAuthSettings(**_auth({"jwks_file": str(path)})), load_definitions(DEFAULT_DIR), Path)
    token = signer.token(["analyst"], kid="r1")  # ES256, signed by an EC key
    with pytest.raises(AuthError, match="the token's algorithm ES256 does not fit its key") as refused:
        asyncio.run(auth.authenticate("/get-online-features", [(b"authorization", f"Bearer {token}".encode())]))
    assert refused.value.status == 401


@pytest.mark.parametrize(
    "url, ok",
    [("https://idp.example/jwks", True), ("http://127.0.0.1:8080/jwks", True), ("http://localhost/jwks", True),
     ("http://[::1]/jwks", True), ("http://localhost@idp.example/jwks", False), ("http://127.0.0.1.evil.example/jwks", False),
     ("http://idp.example/jwks", False), ("ftp://127.0.0.1/jwks", False)],
)  # fmt: skip
def test_a_jwks_url_in_clear_is_refused_unless_its_host_is_loopback(url, ok):
    from fm_config.base import ConfigError
    from fm_config.reader import ServerAuthSettings

    settings = dict(mode="jwt", jwks_url=url, issuer=ISSUER, audience=[AUDIENCE], grants=GRANTS)
    if ok:
        assert ServerAuthSettings(**settings).jwks_url == url
    else:
        with pytest.raises((ConfigError, ValueError), match="jwks_url must be https"):
            ServerAuthSettings(**settings)


# --- materialize doctor: the server's port, TLS files and keys ---------------------------------


def _doctor(**server):
    from fm_config import RunConf
    from jobs.operations.doctor.server import check_server

    return {c.name: c for c in check_server(RunConf(server=server))}


def _cert_valid_for(pki: Pki, folder: Path, days: float) -> Path:
    """A certificate of the server's key from our CA, expiring in ``days`` (negative: expired)."""
    ca_cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
    key = serialization.load_pem_private_key(pki.key.read_bytes(), None)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(ca_cert.subject).issuer_name(ca_cert.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=30))
        .not_valid_after(now + dt.timedelta(days=days)).sign(key, hashes.SHA256())
    )  # fmt: skip
    path = folder / f"cert-{days}.pem"
    path.write_bytes(pem(cert))
    return path


def test_doctor_checks_the_servers_port_tls_files_and_keys(pki, signer, jwt_served, taken_port, tmp_path):
    port = free_port()
    tls = {"cert_file": str(pki.cert), "key_file": str(pki.key), "client_ca_file": str(pki.ca), "expiry_warn_days": 0}  # valid 1 day
    checks = _doctor(port=port, tls=tls)
    assert {n: c.status for n, c in checks.items()} == {
        "server port": "ok", "server.tls": "ok", "server.tls.client_ca_file": "ok", "server auth": "ok"
    }  # fmt: skip
    assert checks["server port"].detail == f"127.0.0.1:{port} is free"
    assert (
        checks["server.tls"].detail.startswith(f"{pki.cert}: 127.0.0.1, localhost, valid until ")
        and "key matches" in checks["server.tls"].detail
    )
    assert checks["server auth"].detail == "none: 127.0.0.1 is a loopback address"

    taken = _doctor(port=taken_port)["server port"]
    assert (taken.status, taken.detail) == ("fail", f"127.0.0.1:{taken_port} is taken by another program") and "server.port" in taken.fix
    ours = _doctor(port=jwt_served.port)["server port"]  # /health is open: a feature server says so
    assert ours.status == "ok" and ours.detail.startswith(f"127.0.0.1:{jwt_served.port}: a feature server already answers there")

    def tls_of(cert: Path, key: Path = pki.key, warn_days: int = 0) -> list[tuple[str, str, str]]:
        tls = {"cert_file": str(cert), "key_file": str(key), "expiry_warn_days": warn_days}
        return [(c.status, n, c.detail) for n, c in _doctor(port=port, tls=tls).items()
                if n.startswith("server.tls")]  # fmt: skip

    expired = _cert_valid_for(pki, tmp_path, -1)
    assert tls_of(expired) == [("fail", "server.tls.cert_file", f"{expired}: expired {_until(expired)} UTC")]
    soon = _cert_valid_for(pki, tmp_path, 3)
    [(status, name, detail)] = tls_of(soon, warn_days=14)
    assert (status, name) == ("warn", "server.tls.cert_file") and detail.startswith(f"{soon}: expires in 3.0 days")
    assert tls_of(pki.cert, pki.client_key) == [
        ("fail", "server.tls.key_file", f"{pki.client_key} is not the key of the certificate in {pki.cert}")
    ]
    assert tls_of(tmp_path / "none.pem") == [("fail", "server.tls.cert_file", f"{tmp_path / 'none.pem'}: No such file or directory")]
    assert tls_of(pki.key, pki.key) == [("fail", "server.tls.cert_file", f"{pki.key}: not a PEM certificate")]

    (tmp_path / "jwks.json").write_bytes(jwks_of(signer))
    (tmp_path / "bad.json").write_text("{not json")
    auth = _auth({"jwks_file": str(tmp_path / "jwks.json")})
    good = _doctor(port=port, auth=auth)["server auth"]
    assert (good.status, good.detail) == ("ok", f"JWT: jwks_file {tmp_path / 'jwks.json'}: 1 key(s); issuer {ISSUER}")
    bad = _doctor(port=port, auth={**auth, "jwks_file": str(tmp_path / "bad.json")})["server auth"]
    assert bad.status == "fail" and bad.detail.startswith(f"server.auth.jwks_file {tmp_path / 'bad.json'}: not JSON")
    open_wide = _doctor(port=port, host="0.0.0.0")
    assert (
        open_wide["server auth"].status == "fail" and "serve refuses to start unauthenticated on 0.0.0.0" in open_wide["server auth"].detail
    )
    assert open_wide["server tls"].status == "warn" and "plain HTTP on 0.0.0.0" in open_wide["server tls"].detail


def _until(path: Path) -> str:
    return f"{x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc:%Y-%m-%d %H:%M}"


def test_tls_files_are_checked_by_the_ssl_module_without_the_auth_extra(pki, monkeypatch):
    """[server] alone (no cryptography): files, PEM and the key's match are still checked; expiry is said to be unchecked."""
    from feature_reader.tls import check_tls_files
    from fm_config.reader import ServerTlsSettings

    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cryptography", None)  # import cryptography: ModuleNotFoundError
    good = check_tls_files(ServerTlsSettings(cert_file=str(pki.cert), key_file=str(pki.key), client_ca_file=str(pki.ca)), Path)
    assert [(status, name) for status, name, _ in good] == [("ok", "server.tls"), ("warn", "server.tls expiry")]
    [(status, name, detail), _] = check_tls_files(ServerTlsSettings(cert_file=str(pki.cert), key_file=str(pki.client_key)), Path)
    assert (status, name) == ("fail", "server.tls.cert_file") and "KEY_VALUES_MISMATCH" in detail


def test_tokens_without_the_auth_extra_stop_the_start_in_one_line_naming_it(redis_server, tmp_path):
    auth = {"mode": "jwt", "jwks_url": "https://idp.test/jwks", "issuer": ISSUER, "audience": [AUDIENCE], "grants": GRANTS}
    folder = env_conf(tmp_path / "conf", "t", json.dumps(_settings(redis_server, 11, auth=auth)))
    code = "import sys; sys.modules['jwt'] = None; from jobs.cli import main; sys.exit(main(sys.argv[1:]))"
    environ = {**os.environ, "FM_CONF_DIR": str(folder)}
    done = subprocess.run([sys.executable, "-c", code, "serve", "--env", "t", "--port", "1"], env=environ,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 2 and done.stderr == (
        "materialize serve needs the token authentication extra (jwt is not installed): pip install 'feature-materializer[auth]'\n"
    ), done.stderr


# --- hostile callers and identity providers that misbehave ---------------------------------------


class Idp:
    """A real JWKS endpoint the test steers: it serves ``body`` at /jwks, trickles it a byte
    every ``trickle`` seconds (faster than any read timeout: only a deadline on the whole
    fetch stops it), and redirects /start to ``location``."""

    def __init__(self, body: bytes, host: str = "127.0.0.1"):
        self.body, self.trickle, self.location, self.paths, self.closed = body, None, None, [], False
        idp = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                idp.paths.append(self.path)
                if self.path == "/start" and idp.location:
                    self.send_response(302)
                    self.send_header("location", idp.location)
                    self.send_header("content-length", "0")
                    self.end_headers()
                    return
                body, trickle = idp.body, idp.trickle
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                for i in range(0, len(body), 1 if trickle else len(body)):
                    if idp.closed:
                        return
                    self.wfile.write(body[i : i + 1] if trickle else body)
                    time.sleep(trickle or 0)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((host, 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, path: str = "/jwks", host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def close(self) -> None:
        self.closed = True
        self.server.shutdown()
        self.server.server_close()


def _rss_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS:")).split()[1])


def _authenticator(settings: dict, **kw):
    from feature_defs import DEFAULT_DIR, load_definitions
    from feature_reader.auth import Authenticator
    from fm_config.reader import ServerAuthSettings

    return Authenticator(ServerAuthSettings(**settings), load_definitions(DEFAULT_DIR), Path, **kw)


def _bearer(token: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {token}".encode())]


def test_refused_requests_leave_nothing_behind_and_the_feature_limit_comes_first(jwt_served, signer):
    """A token that verifies but grants nothing sends bodies near server.max_body_bytes of
    distinct references: each is refused and nothing stays (they were once all kept)."""
    nobody = signer.token(["nobody"])

    def refs(i: int) -> dict:  # 1,000 references (reader.max_features) of ~1,000 characters: ~1 MB of names
        return {"features": [f"s{i:03d}_{j:04d}_{'x' * 990}:f" for j in range(1000)], "entities": {"consumer_id": [1]}}

    for i in range(8):  # warm-up: the allocator's pools at their working size
        _refused(jwt_served.post(refs(i), nobody), 403, "does not grant reading source 's")
    before = _rss_kib(jwt_served.process.pid)
    requests = 48
    for i in range(8, 8 + requests):
        _refused(jwt_served.post(refs(i), nobody), 403, "and 990 more (server.auth.grants)")
    grown = _rss_kib(jwt_served.process.pid) - before
    names_sent_kib = requests * 1000 * 1000 // 1024  # what keeping each refused request would hold, at least
    assert grown < names_sent_kib // 4, f"RSS grew {grown} KiB over {requests} refused requests"
    # over the limit: the limit's answer, before the names are looked at (once: 403 naming them)
    over = {"features": [f"s{j}:f" for j in range(1001)], "entities": {"consumer_id": [1]}}
    _refused(jwt_served.post(over, nobody), 400, "1,001 feature references in one request; the limit is 1,000 (reader.max_features)")


def test_the_authorization_memo_is_bounded_by_the_bytes_it_holds(signer, tmp_path):
    """In process: granted requests are remembered up to DECISION_BYTES of names (measured by
    tracemalloc, not by the memo's own count); refused ones are not remembered at all."""
    import asyncio
    import tracemalloc

    from feature_reader.auth import DECISION_BYTES, AuthError

    (tmp_path / "jwks.json").write_bytes(jwks_of(signer))
    auth = _authenticator(_auth({"jwks_file": str(tmp_path / "jwks.json")}))
    stores = asyncio.run(auth.authenticate("/get-online-features", _bearer(signer.token(["store-model"]))))
    nobody = asyncio.run(auth.authenticate("/get-online-features", _bearer(signer.token(["nobody"]))))
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for i in range(64):  # 500 granted references of ~1,000 characters: ~0.5 MB each, 32 MB in all
        auth.authorize(stores, {"features": [f"store_features_long:{i:03d}_{j:04d}_{'x' * 990}" for j in range(500)]})
    held = tracemalloc.get_traced_memory()[0] - base
    kept = list(auth.decisions)
    for i in range(16):
        with pytest.raises(AuthError):
            auth.authorize(nobody, {"features": [f"s{i:03d}_{j:04d}_{'x' * 990}:f" for j in range(500)]})
    held_after_refusals = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    assert 0 < held <= DECISION_BYTES + (1 << 20), held  # the bound, and some slack for the dict itself
    assert held_after_refusals - held < 1 << 20, held_after_refusals
    assert list(auth.decisions) == kept  # no refusal was kept
    assert auth.decisions.bytes <= DECISION_BYTES and len(auth.decisions) >= 1  # the memo still serves repeats


def _start_announced(tmp: Path, settings: dict) -> Https:
    """``serve`` returned as soon as it says it serves; the port must accept at that moment."""
    folder = env_conf(tmp / f"conf-{len(list(tmp.glob('conf-*')))}", "t", json.dumps(settings))
    environ = {**os.environ, "FM_CONF_DIR": str(folder)}
    log = tmp / f"serve-{folder.name}.log"

    def start(port: int) -> Https:
        process = subprocess.Popen([MATERIALIZE, "serve", "--env", "t", "--port", str(port)], stdout=log.open("wb"),
                                   stderr=subprocess.STDOUT, env=environ)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while "[serve] Feast's feature-server API on" not in log.read_text():
                if process.poll() is not None:
                    raise start_failed(f"the server exited: {log.read_text()}", log)
                assert time.monotonic() < deadline, f"the server never said it serves: {log.read_text()}"
                time.sleep(0.02)
            socket.create_connection(("127.0.0.1", port), timeout=5).close()  # said: so bound
        except BaseException:
            process.kill()
            process.wait()
            raise
        return Https(port, process, log, None)

    return again_if_port_taken(lambda: start(free_port()))


def _answered(post, status: int, seconds: float = 15) -> tuple[int, bytes, dict]:
    deadline = time.monotonic() + seconds
    while True:
        answer = post()
        if answer[0] == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_a_trickling_jwks_url_stops_neither_the_start_nor_the_refresh(signer, redis_server, tmp_path):
    idp = Idp(jwks_of(signer))
    idp.trickle = 0.5  # a byte every half second: each read is quick, the fetch never ends
    auth = _auth({"jwks_url": idp.url()}, jwks_timeout_seconds=1, jwks_refresh_seconds=1)
    served = _start_announced(tmp_path, _settings(redis_server, 11, auth=auth))
    try:
        token = signer.token(["analyst"])
        began = time.monotonic()
        status, body, _ = served.post(RANKING, token)
        assert status == 503, body  # keys not there yet: 503, not 401, and within the fetch's deadline
        assert "no complete answer within 1 s (server.auth.jwks_timeout_seconds)" in json.loads(body)["error"]
        assert time.monotonic() - began < 1 + 1 + 2
        idp.trickle = None
        assert _answered(lambda: served.post(RANKING, token), 200)[0] == 200  # the next refresh brought the keys
        # it trickles again while a key is added: refreshes are cut off, then the key is picked up once it answers
        rotated = Signer("k2")
        idp.body, idp.trickle = jwks_of(signer, rotated), 0.5
        time.sleep(2.5)
        idp.trickle = None
        assert _answered(lambda: served.post(RANKING, rotated.token(["analyst"])), 200)[0] == 200
        assert served.post(RANKING, token)[0] == 200
    finally:
        assert served.stop() == -signal.SIGTERM
        idp.close()
    assert "could not be fetched: no complete answer within 1 s" in served.log.read_text()


def _p192_jwk(kid: str) -> dict:
    import base64

    numbers = ec.generate_private_key(ec.SECP192R1()).public_key().public_numbers()

    def part(n: int) -> str:
        return base64.urlsafe_b64encode(n.to_bytes(24, "big")).rstrip(b"=").decode()

    return {"kty": "EC", "crv": "P-192", "x": part(numbers.x), "y": part(numbers.y), "kid": kid, "use": "sig"}


def _oaep_jwk(kid: str) -> dict:
    from cryptography.hazmat.primitives.asymmetric import rsa

    public = rsa.generate_private_key(65537, 2048).public_key()
    return {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(public)), "kid": kid, "alg": "RSA-OAEP"}  # no "use"


def test_unusable_jwks_entries_are_skipped_and_logged_once_each(signer, redis_server, tmp_path):
    from feature_reader.auth import AuthConfigError, load_jwks

    junk = [_p192_jwk("p192"), _oaep_jwk("enc1")]
    idp = Idp(json.dumps({"keys": [*junk, signer.jwk]}).encode())
    served = start(tmp_path, _settings(redis_server, 11, auth=_auth({"jwks_url": idp.url()}, jwks_refresh_seconds=1)), None)
    try:
        assert _answered(lambda: served.post(RANKING, signer.token(["analyst"])), 200)[0] == 200
        rotated = Signer("k2")
        idp.body = json.dumps({"keys": [*junk, signer.jwk, rotated.jwk]}).encode()
        assert _answered(lambda: served.post(RANKING, rotated.token(["analyst"])), 200)[0] == 200  # rotation goes on
        time.sleep(2.2)  # more refreshes: the same entries are not logged again
    finally:
        assert served.stop() == -signal.SIGTERM
        idp.close()
    lines = served.log.read_text().splitlines()
    assert [line for line in lines if "skipped" in line] == [
        f"WARNING feature_reader.auth: server.auth.jwks_url {idp.url()}: key 0 (kid 'p192') skipped: Unsupported crv: P-192",
        f"WARNING feature_reader.auth: server.auth.jwks_url {idp.url()}: key 1 (kid 'enc1') skipped: its alg 'RSA-OAEP' is not a "
        "signature algorithm",
    ]
    with pytest.raises(AuthConfigError) as none_usable:  # only when no key is usable is the set refused
        load_jwks(json.dumps({"keys": junk}), "jwks.json", skipped=[])
    assert str(none_usable.value) == (
        "jwks.json: no usable RSA, EC or OKP signing key in the JWKS (key 0 (kid 'p192') skipped: Unsupported crv: P-192; "
        "key 1 (kid 'enc1') skipped: its alg 'RSA-OAEP' is not a signature algorithm)"
    )


def test_a_redirect_of_the_jwks_url_is_held_to_its_rule(signer):
    """In process, a real JWKS server on every address: /start redirects to /jwks by a name
    that is not loopback (http, refused before any connection) or by 127.0.0.1 (followed)."""
    import asyncio

    from feature_reader.auth import AuthError

    name = socket.gethostname()
    if name == "localhost" or name.startswith("127."):  # no name of its own: its address on a route out (nothing is sent)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))
            name = probe.getsockname()[0]
    assert not name.startswith("127."), name
    idp = Idp(jwks_of(signer), host="0.0.0.0")
    token = _bearer(signer.token(["analyst"]))
    try:
        idp.location = idp.url(host=name)  # plain http to another host (this one by name: served, were it followed)
        auth = _authenticator(_auth({"jwks_url": idp.url("/start")}))
        with pytest.raises(AuthError) as refused:
            asyncio.run(auth.authenticate("/get-online-features", token))
        assert refused.value.status == 503 and str(refused.value) == (
            f"cannot verify tokens: the JWKS at {idp.url('/start')} could not be fetched: redirected to {idp.location}, "
            "which is not https (nor http on loopback): not followed"
        )
        assert idp.paths == ["/start"]
        idp.location = idp.url()  # http on loopback: allowed, so followed
        auth = _authenticator(_auth({"jwks_url": idp.url("/start")}))
        assert asyncio.run(auth.authenticate("/get-online-features", token)).may_read_source("consumer_daily")
        assert idp.paths == ["/start", "/start", "/jwks"]
    finally:
        idp.close()


def _signed(signer: Signer, **claims) -> str:
    now = int(time.time())
    return jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "iat": now, "roles": ["analyst"], **claims}, signer.key, algorithm="ES256",
                      headers={"kid": signer.kid})  # fmt: skip


def test_time_claims_that_are_not_numbers_get_401(jwt_served, signer):
    later = int(time.time()) + 600
    for claims, name in (({"exp": 10**400}, "exp"), ({"exp": str(later)}, "exp"), ({"exp": later, "nbf": "0"}, "nbf"),
                         ({"exp": later, "iat": True}, "iat")):  # fmt: skip
        token = _signed(signer, **claims)
        _refused(jwt_served.post(RANKING, token), 401, f"the token's {name!r} is not a NumericDate", token)
    assert jwt_served.post(RANKING, _signed(signer, exp=later + 0.5))[0] == 200  # a fraction is a number


def test_cached_tokens_leave_with_their_key(signer):
    """In process, a real JWKS server rotating: at the refresh that removes a key (or changes
    it under its kid), the tokens it verified leave the cache and are refused."""
    import asyncio

    from feature_reader.auth import AuthError

    second = Signer("k2")
    idp = Idp(jwks_of(signer, second))
    auth = _authenticator(_auth({"jwks_url": idp.url()}, jwks_refresh_seconds=1))
    first_token, second_token = _bearer(signer.token(["analyst"])), _bearer(second.token(["analyst"]))

    async def until_refreshed(test) -> None:
        deadline = time.monotonic() + 10
        while not test():
            assert time.monotonic() < deadline, "the keys were never refreshed"
            try:
                await auth.authenticate("/get-online-features", second_token)  # requests drive the refresh
            except AuthError:
                pass  # refused once its key is replaced: asserted below
            await asyncio.sleep(0.1)

    async def run() -> None:
        for _ in range(2):
            await auth.authenticate("/get-online-features", first_token)
            await auth.authenticate("/get-online-features", second_token)
        assert auth.stats == {"verified": 2, "cached": 2, "refused": 0}
        idp.body = jwks_of(second)  # k1 leaves
        await until_refreshed(lambda: "k1" not in auth.keys.keys)
        with pytest.raises(AuthError, match="the token's key id 'k1' is not in the JWKS"):
            await auth.authenticate("/get-online-features", first_token)
        assert auth.stats["cached"] > 2  # k2's token still came from the cache
        replaced = Signer("k2")  # another key under the same kid
        idp.body = jwks_of(replaced)
        await until_refreshed(lambda: auth.keys.keys["k2"][2] == json.dumps(replaced.jwk, sort_keys=True))
        with pytest.raises(AuthError, match="signature does not verify"):
            await auth.authenticate("/get-online-features", second_token)

    try:
        asyncio.run(run())
    finally:
        idp.close()


def test_a_refusal_writes_out_only_the_parts_it_names():
    """A 403 names ten refused sources and counts the others; it wrote out a line for each of
    a thousand, small strings the allocator's pools kept scattered (the soak's hostile phase)."""
    import tracemalloc

    from feature_reader.auth import Grants, forbidden, refused_parts

    grants = Grants(frozenset({"granted"}), frozenset())
    args = {"features": ["granted:f", *(f"s{j:04d}:f" for j in range(1000)), "s0001:g", 7]}
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        shown, count = refused_parts(grants, args, None)
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert count == 1000 and shown == [f"source 's{j:04d}'" for j in range(10)]
    assert kept < 4096, kept  # ten short lines and their list (a thousand lines: about 100 KB)
    expected = ", ".join(f"source 's{j:04d}'" for j in range(10)) + ", and 990 more"
    assert str(forbidden(shown, count)) == f"this token does not grant reading {expected} (server.auth.grants)"
