"""Bench PKI: a CA, a server certificate for 127.0.0.1, a JWT signing key with its JWKS, and bearer tokens.

``make_pki(folder)`` writes ``ca.pem``, ``server.pem``, ``server.key`` and ``jwks.json`` into
``folder`` and returns ``TOKENS`` ES256 tokens (issuer ``ISSUER``, audience ``AUDIENCE``,
role ``bench``, six hours) signed with the key the JWKS publishes (``kid`` ``bench``).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import time
from pathlib import Path

TOKENS = 16
ISSUER, AUDIENCE = "https://idp.bench", "feature-server"


def make_pki(folder: Path) -> dict:
    """A CA, a server certificate for 127.0.0.1, a signing key and its JWKS, and the tokens."""
    import jwt
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def cert(subject: str, issuer_name, key, sign_key, ca: bool):
        builder = (
            x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )  # fmt: skip
        if not ca:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False
            )
        return builder.sign(sign_key, hashes.SHA256())

    ca_key, key, signer = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = cert("bench CA", x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "bench CA")]), ca_key, ca_key, True)
    server = cert("bench server", ca.subject, key, ca_key, False)
    pem = serialization.Encoding.PEM
    (folder / "ca.pem").write_bytes(ca.public_bytes(pem))
    (folder / "server.pem").write_bytes(server.public_bytes(pem))
    (folder / "server.key").write_bytes(key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    jwk = {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(signer.public_key())), "kid": "bench", "use": "sig", "alg": "ES256"}
    (folder / "jwks.json").write_text(json.dumps({"keys": [jwk]}))
    exp = int(time.time()) + 6 * 3600
    tokens = [
        jwt.encode({"iss": ISSUER, "aud": AUDIENCE, "sub": f"model-{i}", "exp": exp, "roles": ["bench"]}, signer, "ES256", {"kid": "bench"})
        for i in range(TOKENS)
    ]
    return {"folder": str(folder), "tokens": tokens}
