"""Bearer-token authentication and authorization of the feature server (``server.auth``).

A read carries ``Authorization: Bearer <JWT>``. The token is verified once against the
public keys of a JWKS (a file, or a URL fetched with a bounded timeout and refreshed in the
background), checking signature, algorithm (asymmetric only), issuer, audience, expiry and
not-before with ``leeway_seconds`` of clock skew; then kept, with what it grants, until it
expires (a bounded cache keyed by the token: a cached token costs a dict lookup). Its
``claim`` values (roles, groups or scopes) map to the sources and feature services the caller
may read (``grants``; "*" for all). 401 (with ``WWW-Authenticate``) says what is wrong with a
token without echoing it; 403 names what the caller may not read.

The liveness and readiness routes are always open (Kubernetes probes send no token);
``/metrics`` is open unless ``server.auth.metrics: authenticated``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import json
import logging
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fm_config import ConfigError

log = logging.getLogger("feature_reader.auth")

MAX_TOKEN_BYTES = 16 << 10
"""A longer Authorization header is refused before anything is parsed."""
UNKNOWN_KID_REFETCH_SECONDS = 30.0
"""A token with an unknown key id fetches the JWKS again at most this often (or every jwks_refresh_seconds if shorter)."""
ALL = "*"
DECISIONS = 4096
"""Authorization decisions kept (then all dropped at once)."""


class AuthError(Exception):
    """A refused request: 401 (no or bad token) or 403 (not granted); ``headers`` to send with it."""

    def __init__(self, status: int, message: str, kind: str, headers: list[tuple[bytes, bytes]] | None = None):
        super().__init__(message)
        self.status, self.kind, self.headers = status, kind, headers or []


class AuthConfigError(ConfigError):
    """The server cannot start with this ``server.auth`` / ``server.tls`` (says which setting)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name other than localhost may resolve anywhere


def check_start(settings, host: str, insecure_no_auth: bool, root_path) -> str:
    """How the server authenticates ("jwt" or "none"); AuthConfigError when it must not start
    unauthenticated, or its JWKS file is missing or bad."""
    mode = settings.auth.mode
    if mode == "jwt":
        import jwt  # noqa: F401 (missing: the [auth] extra, said before any worker starts)

        if settings.auth.jwks_file:
            KeySet(settings.auth, root_path)
        return "jwt"
    if mode == "none" or insecure_no_auth or is_loopback(host):
        return "none"
    raise AuthConfigError(
        f"refusing to serve features without authentication on {host}, which is not a loopback address: "
        "anyone who reaches the port could read every feature. Set server.auth.mode: jwt (with jwks_file or "
        "jwks_url, issuer, audience, grants), or serve unauthenticated on purpose with server.auth.mode: none "
        "or --insecure-no-auth (e.g. behind a proxy that authenticates)"
    )


# -- grants --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grants:
    sources: frozenset[str]
    services: frozenset[str]

    def may_read_source(self, name: str) -> bool:
        return ALL in self.sources or name in self.sources

    def may_read_service(self, name: str) -> bool:
        return ALL in self.services or name in self.services


def _cut(name: Any) -> str:
    text = str(name)
    return text if len(text) <= 80 else text[:80] + "..."


def refused_parts(grants: Grants, args: dict, defs) -> list[str]:
    """What of a parsed request (feast_request.parse_body) the caller may not read, as 'source x' / 'feature service y'."""
    service = args.get("feature_service")
    if service is not None:
        if grants.may_read_service(service):
            return []
        known = defs.services.get(service)  # a service whose every source is granted reads nothing more than those sources
        if known is not None and all(grants.may_read_source(ref.partition(":")[0]) for ref in known.features):
            return []
        return [f"feature service {_cut(service)!r}"]
    names = dict.fromkeys(ref.partition(":")[0] for ref in args.get("features") or () if isinstance(ref, str))
    return [f"source {_cut(n)!r}" for n in names if not grants.may_read_source(n)]


def forbidden(refused: list[str]) -> AuthError:
    shown = refused[:10] + ([f"and {len(refused) - 10} more"] if len(refused) > 10 else [])
    return AuthError(403, f"this token does not grant reading {', '.join(shown)} (server.auth.grants)", "Forbidden")


# -- keys ------------------------------------------------------------------------------------


def load_jwks(data: bytes | str, where: str) -> dict[str, tuple[Any, str | None]]:
    """key id -> (public key, the JWK's "alg" if named) of a JWKS's asymmetric signing keys; AuthConfigError naming ``where``."""
    import jwt

    try:
        document = json.loads(data)
    except ValueError as exc:
        raise AuthConfigError(f"{where}: not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise AuthConfigError(f'{where}: not a JWKS (a JSON object with "keys": [...])')
    keys: dict[str, tuple[Any, str | None]] = {}
    for i, entry in enumerate(document["keys"]):
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or entry.get("kty") not in ("RSA", "EC", "OKP"):
            continue  # encryption keys and symmetric ("oct") keys never verify a token here
        try:
            keys[str(entry.get("kid", ""))] = (jwt.PyJWK(entry).key, entry.get("alg"))
        except jwt.PyJWTError as exc:
            raise AuthConfigError(f"{where}: key {i} ({entry.get('kid', 'no kid')}): {exc}") from None
    if not keys:
        raise AuthConfigError(f"{where}: no RSA, EC or OKP signing key in the JWKS")
    return keys


def _fetch(url: str, timeout: float) -> bytes:
    request = urllib.request.Request(url, headers={"accept": "application/json", "user-agent": "feature-materializer"})
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 (https or loopback, checked by the settings)
        return response.read(1 << 20)


class KeySet:
    """The JWKS keys: from a file once, or from a URL at start and again in the background
    (a thread, so a slow identity provider never stalls the event loop; the last keys stay
    while it is down)."""

    def __init__(self, settings, root_path):
        self.settings = settings
        self.keys: dict[str, tuple[Any, str | None]] = {}
        self.fetched_at = 0.0
        self.failure: str | None = None
        self._refreshing: asyncio.Task | None = None
        if settings.jwks_file:
            path = root_path(settings.jwks_file)
            try:
                data = Path(path).read_bytes()
            except OSError as exc:
                raise AuthConfigError(f"server.auth.jwks_file {path}: {exc.strerror or exc}") from None
            self.keys = load_jwks(data, f"server.auth.jwks_file {path}")
        else:
            self._load_url()  # at start: a failure is logged, reads get 503 until keys arrive

    def _load_url(self) -> None:
        url = self.settings.jwks_url
        try:
            self.keys = load_jwks(_fetch(url, self.settings.jwks_timeout_seconds), f"server.auth.jwks_url {url}")
            self.failure = None
        except (OSError, AuthConfigError) as exc:
            self.failure = f"the JWKS at {url} could not be fetched: {exc}"
            log.warning("%s (keeping %d keys)", self.failure, len(self.keys))
        self.fetched_at = time.monotonic()

    def refresh_if_due(self, unknown_kid: bool = False) -> asyncio.Task | None:
        if not self.settings.jwks_url:
            return None
        age = time.monotonic() - self.fetched_at
        every = self.settings.jwks_refresh_seconds
        due = age >= (min(UNKNOWN_KID_REFETCH_SECONDS, every) if unknown_kid or not self.keys else every)
        if due and (self._refreshing is None or self._refreshing.done()):
            self._refreshing = asyncio.get_running_loop().create_task(asyncio.to_thread(self._load_url))
        return self._refreshing


# -- tokens ------------------------------------------------------------------------------------


def _challenge(error: str | None, description: str | None) -> list[tuple[bytes, bytes]]:
    value = 'Bearer realm="feature-server"'
    if error:
        value += f', error="{error}", error_description="{description}"'
    return [(b"www-authenticate", value.encode())]


def unauthorized(message: str, error: str | None = "invalid_token") -> AuthError:
    # the description goes in a header: ASCII, no quotes (names from the token are already repr()-escaped)
    return AuthError(401, message, "Unauthorized", _challenge(error, message.replace('"', "'").encode("ascii", "replace").decode()))


class Authenticator:
    """Verifies bearer tokens (cached until they expire) and checks what they grant."""

    def __init__(self, settings, defs, root_path, clock=time.time):
        import jwt

        self.jwt = jwt
        self.settings, self.defs, self.clock = settings, defs, clock
        self.keys = KeySet(settings, root_path)
        self.grants = {value: (frozenset(g.sources), frozenset(g.feature_services)) for value, g in settings.grants.items()}
        self.cache: dict[bytes, tuple[float, Grants]] = {}
        self.decisions: dict[tuple, list[str]] = {}
        self.open_paths = {"/health", "/health/live", "/health/ready", "/openapi.json"}
        if settings.metrics == "open":
            self.open_paths.add("/metrics")
        self.stats = {"verified": 0, "cached": 0, "refused": 0}

    def register(self, registry) -> None:
        """Its counters in /metrics: tokens verified, answered from the cache, requests refused (401)."""
        from prometheus_client.core import CounterMetricFamily

        stats = self.stats

        class Collector:
            def collect(self):
                for name, text in (("verified", "verified"), ("cached", "found verified in the cache"), ("refused", "refused (401)")):
                    yield CounterMetricFamily(f"feature_server_auth_tokens_{name}", f"Bearer tokens {text}", value=stats[name])

        registry.register(Collector())

    async def authenticate(self, path: str, headers) -> Grants | None:
        """The caller's grants (None on an open route); AuthError 401 when its token is missing or bad."""
        if path in self.open_paths:
            return None
        token = None
        for name, value in headers:
            if name == b"authorization":
                token = value
                break
        if token is None:
            self.stats["refused"] += 1
            raise unauthorized("this server needs a bearer token: send 'Authorization: Bearer <JWT>'", None)
        hit = self.cache.get(token)
        if hit is not None and hit[0] > self.clock():
            self.stats["cached"] += 1
            return hit[1]
        try:
            expires, grants = await self._verify(token)
        except AuthError:
            self.stats["refused"] += 1
            raise
        self.stats["verified"] += 1
        if self.settings.cache_entries:
            if len(self.cache) >= self.settings.cache_entries:
                self._evict()
            self.cache[token] = (expires, grants)
        return grants

    def authorize(self, grants: Grants | None, args: dict) -> None:
        """AuthError 403 naming what of this parsed request the caller may not read.

        Decisions are kept per (grants, request's names): models repeat their requests, and
        splitting 50 references costs more than the rest of the check (14 us against 1)."""
        if grants is None:
            return
        service, features = args.get("feature_service"), args.get("features")
        if service is None and ALL in grants.sources:
            return
        try:
            key = (grants, service, tuple(features) if isinstance(features, list) else None)
            refused = self.decisions.get(key)
        except TypeError:  # a reference that is not a string: decided (and refused by the reader) without the memo
            key, refused = None, None
        if refused is None:
            refused = refused_parts(grants, args, self.defs)
            if key is not None:
                if len(self.decisions) >= DECISIONS:
                    self.decisions.clear()
                self.decisions[key] = refused
        if refused:
            raise forbidden(refused)

    def _evict(self) -> None:
        now = self.clock()
        for token in [t for t, (exp, _) in self.cache.items() if exp <= now]:
            del self.cache[token]
        if len(self.cache) >= self.settings.cache_entries:  # still full: the oldest tenth out, so the next sweep is that many tokens away
            for token in list(itertools.islice(self.cache, max(1, self.settings.cache_entries // 10))):
                del self.cache[token]

    async def _verify(self, header: bytes) -> tuple[float, Grants]:
        jwt, s = self.jwt, self.settings
        if len(header) > MAX_TOKEN_BYTES:
            raise unauthorized(f"the Authorization header is longer than {MAX_TOKEN_BYTES:,} bytes")
        scheme, _, token = header.decode("latin-1").partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized("the Authorization header is not 'Bearer <JWT>'", "invalid_request")
        try:
            head = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise unauthorized("the bearer token is not a JWT") from None
        algorithm = head.get("alg")
        if algorithm not in s.algorithms:
            raise unauthorized(
                f"the token's algorithm {_cut(algorithm)!r} is not accepted (server.auth.algorithms: {', '.join(s.algorithms)})"
            )
        key, key_algorithm = await self._key(str(head.get("kid", "")))
        if key_algorithm not in (None, algorithm):
            raise unauthorized(f"the token's algorithm {algorithm} is not its key's ({key_algorithm})")
        try:
            claims = jwt.decode(
                token, key, algorithms=[algorithm], audience=s.audience, issuer=s.issuer, leeway=s.leeway_seconds,
                options={"require": ["exp", "iss", "aud"]},
            )  # fmt: skip
        except jwt.ExpiredSignatureError:
            raise unauthorized("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise unauthorized("the token is not valid yet (nbf or iat in the future)") from None
        except jwt.InvalidAudienceError:
            raise unauthorized(f"the token is not for this server (aud is not one of {', '.join(s.audience)})") from None
        except jwt.InvalidIssuerError:
            raise unauthorized(f"the token is not from the accepted issuer {s.issuer}") from None
        except jwt.MissingRequiredClaimError as exc:
            raise unauthorized(f"the token has no {exc.claim!r} claim") from None
        except jwt.InvalidSignatureError:
            raise unauthorized("the token's signature does not verify") from None
        except jwt.PyJWTError as exc:
            raise unauthorized(f"the token is invalid: {type(exc).__name__}") from None
        except (TypeError, ValueError):  # PyJWT's own, for an algorithm of another key type (ES256 on an RSA key without "alg")
            raise unauthorized(f"the token's algorithm {algorithm} does not fit its key") from None
        return float(claims["exp"]) + s.leeway_seconds, self._grants(claims)

    async def _key(self, kid: str):
        key = self.keys.keys.get(kid)
        if key is None and kid == "" and len(self.keys.keys) == 1:
            key = next(iter(self.keys.keys.values()))  # a JWKS of one key, tokens without kid
        if key is not None:
            self.keys.refresh_if_due()
            return key
        refreshing = self.keys.refresh_if_due(unknown_kid=True)
        if refreshing is not None:
            await asyncio.wait({refreshing}, timeout=self.settings.jwks_timeout_seconds + 1)  # the fetch has its own timeout
            key = self.keys.keys.get(kid)
            if key is not None:
                return key
        if not self.keys.keys and self.keys.failure:
            raise AuthError(503, "cannot verify tokens: " + self.keys.failure, "KeysUnavailable")
        raise unauthorized(f"the token's key id {_cut(kid)!r} is not in the JWKS")

    def _grants(self, claims: dict) -> Grants:
        values = claims.get(self.settings.claim, [])
        if isinstance(values, str):
            values = values.split()
        sources: set[str] = set()
        services: set[str] = set()
        for value in values if isinstance(values, list) else []:
            granted = self.grants.get(value) if isinstance(value, str) else None
            if granted:
                sources |= granted[0]
                services |= granted[1]
        return Grants(frozenset(sources), frozenset(services))
