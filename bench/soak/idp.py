"""The soak's identity provider: an ES256 signing key, the tokens it signs, and a real JWKS
HTTP endpoint on loopback (a thread of the driver) that can be switched to trickle its
answer a byte at a time (the hostile phase)."""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid

ISSUER = "https://idp.soak.test"
AUDIENCE = "feature-server"
READER = "soak-reader"
"""The role of the load's token: every feature of the standard source."""
OTHER = "other-model"
"""A role granting a source the soak never reads: its holders are refused (403) whatever they name here."""
PUSHER = "soak-pusher"
"""The role of the push phase's token: pushes to the soak's push source, nothing to read."""
NOBODY = "nobody"
"""A role with no grant at all: its tokens verify and grant nothing."""


class Signer:
    """An identity provider's signing key (ES256) and its public JWK."""

    def __init__(self, kid: str = "soak-1"):
        import jwt
        from cryptography.hazmat.primitives.asymmetric import ec

        self.kid = kid
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.jwk = {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key())), "kid": kid, "use": "sig", "alg": "ES256"}

    def token(self, roles: list[str], lifetime: float = 4 * 3600) -> str:
        """A token for ``roles``; each call a distinct one (its own jti), so the server verifies it afresh."""
        import jwt

        now = int(time.time())
        claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "soak", "iat": now, "exp": now + int(lifetime), "jti": uuid.uuid4().hex,
                  "roles": roles}  # fmt: skip
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": self.kid})

    def jwks(self) -> bytes:
        return json.dumps({"keys": [self.jwk]}).encode()


class Idp:
    """The JWKS at ``url``; ``trickle`` (seconds) sends it a byte at a time, that long between
    bytes. Each fetch is noted: (began, ended, bytes sent, whole)."""

    def __init__(self, body: bytes):
        self.body, self.trickle, self.closed = body, None, False
        self.fetches: list[tuple[float, float, int, bool]] = []
        idp = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                began, body, sent = time.time(), idp.body, 0
                try:
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    while sent < len(body) and not idp.closed:
                        step = 1 if idp.trickle else len(body) - sent
                        self.wfile.write(body[sent : sent + step])
                        self.wfile.flush()
                        sent += step
                        if idp.trickle and sent < len(body):
                            time.sleep(idp.trickle)
                except OSError:
                    pass  # the server gave up on it (its fetch deadline)
                idp.fetches.append((began, time.time(), sent, sent == len(body)))

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/jwks"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closed = True
        self.server.shutdown()
        self.server.server_close()


def auth_settings(url: str, refresh_seconds: float) -> dict:
    """``server.auth`` of the soak's servers: keys from ``url``, fetched again every ``refresh_seconds``."""
    from bench.soak.data import PUSHED
    from bench.standard import SOURCE

    grants = {
        READER: {"sources": [SOURCE]}, OTHER: {"sources": ["a_source_the_soak_never_reads"]}, PUSHER: {"push": [PUSHED]},
    }  # fmt: skip
    return {"mode": "jwt", "jwks_url": url, "issuer": ISSUER, "audience": [AUDIENCE], "grants": grants,
            "jwks_refresh_seconds": refresh_seconds}  # fmt: skip
