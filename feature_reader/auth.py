"""Bearer-token authentication and authorization of the feature server (``server.auth``).

A read carries ``Authorization: Bearer <JWT>``. The token is verified once against the
public keys of a JWKS (a file, or a URL fetched within a deadline and refreshed in the
background), checking signature, algorithm (asymmetric only), issuer, audience, expiry and
not-before with ``leeway_seconds`` of clock skew; then kept, with what it grants, until it
expires or its key leaves the JWKS (a bounded cache keyed by the token: a cached token
costs a dict lookup). Its
``claim`` values (roles, groups or scopes) map to the sources and feature services the caller
may read, and push to (``grants``; "*" for all). 401 (with ``WWW-Authenticate``) says what is wrong with a
token without echoing it; 403 names what the caller may not read.

The liveness and readiness routes are always open (Kubernetes probes send no token);
``/metrics`` is open unless ``server.auth.metrics: authenticated``.
"""

from __future__ import annotations

import asyncio
import http.client
import ipaddress
import itertools
import json
import logging
import math
import socket
import ssl
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

from feature_reader.errors import RequestError
from feature_reader.memo import BoundedMemo, names_bytes
from fm_config import ConfigError
from fm_config.reader import SAFE_ALGORITHMS, fetched_safely

log = logging.getLogger("feature_reader.auth")

MAX_TOKEN_BYTES = 16 << 10
"""A longer Authorization header is refused before anything is parsed."""
UNKNOWN_KID_REFETCH_SECONDS = 30.0
"""A token with an unknown key id fetches the JWKS again at most this often (or every jwks_refresh_seconds if shorter)."""
ALL = "*"
DECISIONS = 4096
"""Authorization decisions kept (then all dropped at once)."""
DECISION_BYTES = 4 << 20
"""Bytes of the requests' names those decisions may hold (then all dropped at once)."""
MAX_JWKS_BYTES = 1 << 20
"""A longer JWKS answer is refused."""
JWKS_REDIRECTS = 3
"""Redirects followed when fetching the JWKS, each target held to jwks_url's rule."""


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
            load_jwks(*_read_file(settings.auth, root_path), skipped=[])  # skipped entries: logged by the server's own load
        return "jwt"
    if mode == "none" or insecure_no_auth or is_loopback(host):
        return "none"
    writes = " and write every pushed source's values (server.push is on)" if settings.push.enabled else ""
    raise AuthConfigError(
        f"refusing to serve features without authentication on {host}, which is not a loopback address: "
        f"anyone who reaches the port could read every feature{writes}. Set server.auth.mode: jwt (with jwks_file or "
        "jwks_url, issuer, audience, grants), or serve unauthenticated on purpose with server.auth.mode: none "
        "or --insecure-no-auth (e.g. behind a proxy that authenticates)"
    )


# -- grants --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Grants:
    sources: frozenset[str]
    services: frozenset[str]
    push: frozenset[str] = frozenset()
    """Sources the caller may push to (server.push)."""

    def may_push(self, name: str) -> bool:
        return ALL in self.push or name in self.push

    def may_read_source(self, name: str) -> bool:
        return ALL in self.sources or name in self.sources

    def may_read_service(self, name: str) -> bool:
        return ALL in self.services or name in self.services


def _cut(name: Any) -> str:
    text = str(name)
    return text if len(text) <= 80 else text[:80] + "..."


SHOWN_REFUSALS = 10
"""Refused parts a 403 names; the others are counted."""


def refused_parts(grants: Grants, args: dict, defs) -> tuple[list[str], int]:
    """What of a parsed request (feast_request.parse_body) the caller may not read: the first
    SHOWN_REFUSALS as 'source x' / 'feature service y', and how many in all. Only those shown
    are written out: a body of a thousand refused references made a thousand small strings
    per request, which the allocator's pools kept scattered (the soak's hostile phase)."""
    service = args.get("feature_service")
    if service is not None:
        if grants.may_read_service(service):
            return [], 0
        known = defs.services.get(service)  # a service whose every source is granted reads nothing more than those sources
        if known is not None and all(grants.may_read_source(ref.partition(":")[0]) for ref in known.features):
            return [], 0
        return [f"feature service {_cut(service)!r}"], 1
    shown: list[str] = []
    seen: set[str] = set()
    count = 0
    for ref in args.get("features") or ():
        if not isinstance(ref, str):
            continue
        at = ref.find(":")
        name = ref if at < 0 else ref[:at]
        if name in seen or grants.may_read_source(name):
            continue
        seen.add(name)
        count += 1
        if len(shown) < SHOWN_REFUSALS:
            shown.append(f"source {_cut(name)!r}")
    return shown, count


def forbidden(shown: list[str], count: int) -> AuthError:
    more = [f"and {count - len(shown)} more"] if count > len(shown) else []
    return AuthError(403, f"this token does not grant reading {', '.join(shown + more)} (server.auth.grants)", "Forbidden")


# -- keys ------------------------------------------------------------------------------------


def load_jwks(data: bytes | str, where: str, skipped: list[str] | None = None) -> dict[str, tuple[Any, str | None, str]]:
    """key id -> (public key, the JWK's "alg" if named, the JWK as text) of a JWKS's usable
    asymmetric signing keys. An entry PyJWT cannot load (a P-192 curve, an encryption
    algorithm) is skipped, said in ``skipped`` (or logged): one bad entry must not stop the
    rotation of the others. AuthConfigError naming ``where`` when no key is usable."""
    import jwt

    try:
        document = json.loads(data)
    except ValueError as exc:
        raise AuthConfigError(f"{where}: not JSON ({exc})") from None
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise AuthConfigError(f'{where}: not a JWKS (a JSON object with "keys": [...])')
    keys: dict[str, tuple[Any, str | None, str]] = {}
    unusable: list[str] = []
    for i, entry in enumerate(document["keys"]):
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig" or entry.get("kty") not in ("RSA", "EC", "OKP"):
            continue  # encryption keys and symmetric ("oct") keys never verify a token here
        kid, algorithm = entry.get("kid", ""), entry.get("alg")
        why = None if algorithm is None or algorithm in SAFE_ALGORITHMS else f"its alg {_cut(algorithm)!r} is not a signature algorithm"
        if why is None:
            try:
                keys[str(kid)] = (jwt.PyJWK(entry).key, algorithm, json.dumps(entry, sort_keys=True))
                continue
            except jwt.PyJWTError as exc:  # its message may end with the whole JWK: cut there
                why = _cut(str(exc).split(": {", 1)[0])
        unusable.append(f"key {i} (kid {_cut(kid)!r}) skipped: {why}")
    if skipped is None:
        for line in unusable:
            log.warning("%s: %s", where, line)
    else:
        skipped += unusable
    if not keys:
        said = f" ({'; '.join(unusable[:3])})" if unusable else ""
        raise AuthConfigError(f"{where}: no usable RSA, EC or OKP signing key in the JWKS{said}")
    return keys


def _read_file(settings, root_path) -> tuple[bytes, str]:
    path = root_path(settings.jwks_file)
    try:
        return Path(path).read_bytes(), f"server.auth.jwks_file {path}"
    except OSError as exc:
        raise AuthConfigError(f"server.auth.jwks_file {path}: {exc.strerror or exc}") from None


def _fetch(url: str, timeout: float) -> bytes:
    """The JWKS at ``url``, all of it within ``timeout`` seconds (connection, redirects, head
    and body: an endpoint trickling a byte at a time is cut off at the deadline). A redirect
    is followed only to a URL jwks_url itself could be (https, or http on loopback)."""
    deadline = time.monotonic() + timeout
    for _ in range(JWKS_REDIRECTS + 1):
        status, location, body = _get(url, deadline, timeout)
        if location is None:
            return body
        target = urljoin(url, location)
        if not fetched_safely(target):
            raise OSError(f"redirected to {_cut(target)}, which is not https (nor http on loopback): not followed")
        url = target
    raise OSError(f"more than {JWKS_REDIRECTS} redirects")


def _get(url: str, deadline: float, timeout: float) -> tuple[int, str | None, bytes]:
    """One GET: (status, the redirect's Location or None, body); OSError for any other status."""
    parts = urlsplit(url)
    https = parts.scheme == "https"
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise TimeoutError(f"no complete answer within {timeout:g} s (server.auth.jwks_timeout_seconds)")
    connection = (http.client.HTTPSConnection(parts.hostname, parts.port or 443, timeout=remaining, context=ssl.create_default_context())
                  if https else http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=remaining))  # fmt: skip
    watchdog = _Watchdog(connection, remaining)
    try:
        connection.request("GET", (parts.path or "/") + (f"?{parts.query}" if parts.query else ""),
                           headers={"accept": "application/json", "user-agent": "feature-materializer"})  # fmt: skip
        response = connection.getresponse()
        if response.status in (301, 302, 303, 307, 308):
            return response.status, response.getheader("location") or "", b""
        if response.status != 200:
            raise OSError(f"HTTP {response.status} {_cut(response.reason)}")
        body = response.read(MAX_JWKS_BYTES + 1)
    except (OSError, http.client.HTTPException) as exc:
        if watchdog.fired:
            raise TimeoutError(f"no complete answer within {timeout:g} s (server.auth.jwks_timeout_seconds)") from None
        raise OSError(str(exc) or type(exc).__name__) from None
    finally:
        watchdog.stop()
        connection.close()
    if watchdog.fired:  # an answer without a length, cut short
        raise TimeoutError(f"no complete answer within {timeout:g} s (server.auth.jwks_timeout_seconds)")
    if len(body) > MAX_JWKS_BYTES:
        raise OSError(f"the answer is longer than {MAX_JWKS_BYTES:,} bytes")
    return response.status, None, body


class _Watchdog:
    """Shuts a connection's socket at the deadline: a socket timeout bounds each read, not
    their sum, and a blocked read (TLS handshake included) ends only when its socket does."""

    def __init__(self, connection: http.client.HTTPConnection, seconds: float):
        self.fired, self.stopped, self.lock = False, False, threading.Lock()
        self.copy: socket.socket | None = None
        connection._create_connection = self._connect  # http.client's hook for its socket
        self.timer = threading.Timer(seconds, self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _connect(self, *args, **kwargs) -> socket.socket:
        sock = socket.create_connection(*args, **kwargs)
        with self.lock:
            if not self.stopped:
                # a duplicate of the descriptor: shutting it ends reads on the original, which TLS detaches and wraps
                self.copy = sock.dup()
        return sock

    def _fire(self) -> None:
        with self.lock:
            if self.copy is not None:  # None: still connecting (the connect has its own timeout) or done
                self.fired = True
                try:
                    self.copy.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self.timer.cancel()
        with self.lock:
            self.stopped = True
            if self.copy is not None:
                self.copy.close()
                self.copy = None


class KeySet:
    """The JWKS keys: from a file once, or from a URL, fetched in a thread (a slow identity
    provider never stalls the event loop; the last keys stay while it is down). A server's
    key set (``background``) fetches first when its event loop starts, so a slow URL never
    holds up binding the port (reads get 503 until keys arrive); otherwise (the doctor) at once."""

    def __init__(self, settings, root_path, background: bool = False):
        self.settings = settings
        self.keys: dict[str, tuple[Any, str | None, str]] = {}
        self.fetched_at = 0.0
        self.failure: str | None = None
        self._refreshing: asyncio.Task | None = None
        self._skipped: set[str] = set()  # entries skipped by the last load: logged once, not at every refresh
        if settings.jwks_file:
            self._load(*_read_file(settings, root_path))
        elif not background:
            self._load_url()

    def _load(self, data: bytes, where: str) -> None:
        skipped: list[str] = []
        keys = load_jwks(data, where, skipped)
        for line in skipped:
            if line not in self._skipped:
                log.warning("%s: %s", where, line)
        self._skipped = set(skipped)
        self.keys = keys  # replaced whole, never changed in place: the event loop reads it while this thread runs

    def _load_url(self) -> None:
        url = self.settings.jwks_url
        try:
            self._load(_fetch(url, self.settings.jwks_timeout_seconds), f"server.auth.jwks_url {url}")
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

    def missing(self) -> str:
        """Why no token can be verified yet (no keys)."""
        return self.failure or f"the JWKS at {self.settings.jwks_url} has not been fetched yet"


# -- tokens ------------------------------------------------------------------------------------


def _challenge(error: str | None, description: str | None) -> list[tuple[bytes, bytes]]:
    value = 'Bearer realm="feature-server"'
    if error:
        value += f', error="{error}", error_description="{description}"'
    return [(b"www-authenticate", value.encode())]


def unauthorized(message: str, error: str | None = "invalid_token") -> AuthError:
    # the description goes in a header: ASCII, no quotes (names from the token are already repr()-escaped)
    return AuthError(401, message, "Unauthorized", _challenge(error, message.replace('"', "'").encode("ascii", "replace").decode()))


class DecisionMemo(BoundedMemo):
    """Requests found granted, per (grants, feature service, references): models repeat their
    requests. A refused request is never kept, so a caller sending distinct refused requests
    leaves nothing behind."""

    def __init__(self, max_entries: int = DECISIONS, max_bytes: int = DECISION_BYTES):
        super().__init__(max_entries, max_bytes)

    def keep(self, key: tuple) -> None:
        _, service, refs = key
        super().keep(key, True, 200 + sys.getsizeof(service) + names_bytes(refs))


def _numeric_date(value: Any) -> bool:
    """RFC 7519's NumericDate: a JSON number (not a string, not a boolean) a float can hold."""
    if type(value) is not int and type(value) is not float:
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


class Authenticator:
    """Verifies bearer tokens (cached until they expire, or until their key leaves the JWKS)
    and checks what they grant."""

    def __init__(self, settings, defs, root_path, clock=time.time, max_features: int = 1000):
        import jwt

        self.jwt = jwt
        self.settings, self.defs, self.clock, self.max_features = settings, defs, clock, max_features
        self.keys = KeySet(settings, root_path, background=True)
        self.grants = {
            value: (frozenset(g.sources), frozenset(g.feature_services), frozenset(g.push)) for value, g in settings.grants.items()
        }
        self.cache: dict[bytes, tuple[float, Grants, str]] = {}  # token -> (expires, grants, the kid that verified it)
        self.refreshed = bool(settings.jwks_url)
        self._cached_keys = self.keys.keys  # the keys the cached tokens were verified with
        self.decisions = DecisionMemo()
        self.open_paths = {"/health", "/health/live", "/health/ready", "/openapi.json"}
        if settings.metrics == "open":
            self.open_paths.add("/metrics")
        self.stats = {"verified": 0, "cached": 0, "refused": 0}

    def start(self) -> None:
        """The first fetch of a JWKS URL, in the background (called when the event loop runs)."""
        self.keys.refresh_if_due()

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
        if self.refreshed:  # keys from a URL: on schedule, whether tokens come from the cache or not
            self.keys.refresh_if_due()
            if self.keys.keys is not self._cached_keys:
                self._forget_removed_keys()
        hit = self.cache.get(token)
        if hit is not None and hit[0] > self.clock():
            self.stats["cached"] += 1
            return hit[1]
        try:
            expires, grants, kid = await self._verify(token)
        except AuthError:
            self.stats["refused"] += 1
            raise
        self.stats["verified"] += 1
        if self.settings.cache_entries:
            if len(self.cache) >= self.settings.cache_entries:
                self._evict()
            self.cache[token] = (expires, grants, kid)
        return grants

    def _forget_removed_keys(self) -> None:
        """A refresh replaced the keys: tokens verified with a key that left the JWKS (or changed
        under its kid) leave the cache, so they are verified again (and refused)."""
        keys, before = self.keys.keys, self._cached_keys
        gone = {kid for kid, (_, _, jwk) in before.items() if kid not in keys or keys[kid][2] != jwk}
        self._cached_keys = keys
        if gone:
            for token in [t for t, (_, _, kid) in self.cache.items() if kid in gone]:
                del self.cache[token]

    def authorize(self, grants: Grants | None, args: dict) -> None:
        """AuthError 403 naming what of this parsed request the caller may not read; first, the
        request's size limit (RequestError): an oversized request is refused before any work.

        Granted requests are remembered (DecisionMemo): splitting 50 references costs more than
        the rest of the check (14 us against 1)."""
        if grants is None:
            return
        service, features = args.get("feature_service"), args.get("features")
        if isinstance(features, list) and len(features) > self.max_features:
            raise RequestError(
                f"{len(features):,} feature references in one request; the limit is {self.max_features:,} (reader.max_features)"
            )
        if service is None and ALL in grants.sources:
            return
        try:
            key = (grants, service, tuple(features) if isinstance(features, list) else None)
            if key in self.decisions:
                return
        except TypeError:  # a reference that is not a string: decided (and refused by the reader) without the memo
            key = None
        shown, count = refused_parts(grants, args, self.defs)
        if count:
            raise forbidden(shown, count)
        if key is not None:
            self.decisions.keep(key)

    def _evict(self) -> None:
        now = self.clock()
        for token in [t for t, (exp, _, _) in self.cache.items() if exp <= now]:
            del self.cache[token]
        if len(self.cache) >= self.settings.cache_entries:  # still full: the oldest tenth out, so the next sweep is that many tokens away
            for token in list(itertools.islice(self.cache, max(1, self.settings.cache_entries // 10))):
                del self.cache[token]

    async def _verify(self, header: bytes) -> tuple[float, Grants, str]:
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
        kid, (key, key_algorithm, _) = await self._key(str(head.get("kid", "")))
        if key_algorithm not in (None, algorithm):
            raise unauthorized(f"the token's algorithm {algorithm} is not its key's ({key_algorithm})")
        claims = self._decode(token, key, algorithm)
        for name in ("exp", "nbf", "iat"):
            if name in claims and not _numeric_date(claims[name]):  # PyJWT takes "123" and numbers past float range
                raise unauthorized(f"the token's {name!r} is not a NumericDate (a number of seconds, RFC 7519)")
        return float(claims["exp"]) + s.leeway_seconds, self._grants(claims), kid

    def _decode(self, token: str, key, algorithm: str) -> dict:
        jwt, s = self.jwt, self.settings
        try:
            return jwt.decode(
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
        except OverflowError:  # a time claim past float range, compared with a float
            raise unauthorized("the token's time claims are not NumericDates (numbers of seconds, RFC 7519)") from None

    async def _key(self, kid: str) -> tuple[str, tuple[Any, str | None, str]]:
        found = _find(self.keys.keys, kid)
        if found is not None:
            return found
        refreshing = self.keys.refresh_if_due(unknown_kid=True)
        if refreshing is not None:
            await asyncio.wait({refreshing}, timeout=self.settings.jwks_timeout_seconds + 1)  # the fetch has its own deadline
            found = _find(self.keys.keys, kid)
            if found is not None:
                return found
        if not self.keys.keys:
            raise AuthError(503, "cannot verify tokens: " + self.keys.missing(), "KeysUnavailable")
        raise unauthorized(f"the token's key id {_cut(kid)!r} is not in the JWKS")

    def _grants(self, claims: dict) -> Grants:
        values = claims.get(self.settings.claim, [])
        if isinstance(values, str):
            values = values.split()
        sources: set[str] = set()
        services: set[str] = set()
        push: set[str] = set()
        for value in values if isinstance(values, list) else []:
            granted = self.grants.get(value) if isinstance(value, str) else None
            if granted:
                sources |= granted[0]
                services |= granted[1]
                push |= granted[2]
        return Grants(frozenset(sources), frozenset(services), frozenset(push))


def _find(keys: dict, kid: str) -> tuple[str, tuple[Any, str | None, str]] | None:
    """(kid, key) of a token's kid; a JWKS of one key also verifies tokens without a kid."""
    key = keys.get(kid)
    if key is None and kid == "" and len(keys) == 1:
        kid, key = next(iter(keys.items()))
    return None if key is None else (kid, key)
