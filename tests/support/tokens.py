"""An identity provider for the suite: an ES256 signing key, its public JWK and the tokens it signs."""

from __future__ import annotations

import json
import time

import jwt
from cryptography.hazmat.primitives.asymmetric import ec

ISSUER = "https://idp.test"
AUDIENCE = "feature-server"


class Signer:
    """An identity provider's signing key (ES256) and its public JWK."""

    def __init__(self, kid: str):
        self.kid = kid
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.jwk = {**json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.key.public_key())), "kid": kid, "use": "sig", "alg": "ES256"}

    def token(
        self, roles, *, exp_in: float = 600, iss: str = ISSUER, aud: str = AUDIENCE, claim: str = "roles", kid: str | None = None
    ) -> str:
        now = int(time.time())
        claims = {"iss": iss, "aud": aud, "sub": "model-1", "iat": now, "exp": now + int(exp_in), claim: roles}
        return jwt.encode(claims, self.key, algorithm="ES256", headers={"kid": kid or self.kid})


def jwks_of(*signers: Signer) -> bytes:
    return json.dumps({"keys": [s.jwk for s in signers]}).encode()
