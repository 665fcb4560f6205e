"""Connections to Redis: TLS always verified, credentials never in URLs or messages,
redis-py's own retry off (retries happen in one place, :mod:`sinks.retry`).

Used by the writers on the executors and by every driver-side step (preflight, verify,
cleanup); the reader builds its connections here too.
"""

from __future__ import annotations

import os
import ssl
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from sinks.errors import TerminalSinkError
from sinks.redis.config import RedisSinkConfig, RedisTls

TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
"""redis-py errors that a later attempt may not see (a refused password aside: see is_transient)."""


def is_transient(exc: BaseException) -> bool:
    # a refused password is a ConnectionError to redis-py, but no retry fixes it
    return isinstance(exc, TRANSIENT) and not isinstance(exc, redis.AuthenticationError)


class TlsVerificationError(TerminalSinkError):
    """The server's certificate did not verify: a configuration problem, never retried."""


class _VerifiedSSLConnection(redis.SSLConnection):
    # redis-py reports a failed certificate check as a ConnectionError, which every retry
    # would repeat in vain: make it terminal, and name the server.
    def _connect(self):
        try:
            return super()._connect()
        except ssl.SSLCertVerificationError as exc:
            raise TlsVerificationError(
                f"Redis at {self.host}:{self.port}: TLS certificate verification failed ({exc.verify_message}); "
                "check redis.tls_ca_file, and that the URL's host is named in the server's certificate"
            ) from exc


class _PlainConnection(redis.Connection):
    # A TLS-only port drops a plain connection at its first command: say what that may mean.
    def on_connect_check_health(self, check_health: bool = True):
        try:
            super().on_connect_check_health(check_health)
        except redis.ConnectionError as exc:
            if type(exc) is not redis.ConnectionError:  # refused AUTH, loading: not a drop
                raise
            raise redis.ConnectionError(f"{exc} (dropped during the handshake: if the server takes TLS only, use a rediss:// URL)") from exc


def _tls_options(url: str, tls: RedisTls | None) -> dict:
    """redis-py arguments for the URL: verified TLS for rediss://, and TLS files only there."""
    parts = urlsplit(url)
    # redis-py lets URL query arguments win over keyword ones (?ssl_cert_reqs=none would)
    overrides = sorted(k for k in parse_qs(parts.query) if k.startswith("ssl_"))
    if overrides:
        raise TerminalSinkError(f"the Redis URL sets {', '.join(overrides)}: TLS is configured with redis.tls_* only, and is always verified")
    tls = tls or RedisTls()
    files = tls.files()
    if parts.scheme != "rediss":
        if files:
            raise TerminalSinkError(f"{', '.join(files)} set, but the Redis URL {server_address(url)} is not rediss://: refusing to connect without TLS")
        return {"connection_class": _PlainConnection} if parts.scheme == "redis" else {}
    missing = [f"{name} {path}" for name, path in files.items() if not os.path.isfile(path)]
    if missing:
        raise TerminalSinkError(f"Redis TLS file(s) not found on this host: {', '.join(missing)}")
    if tls.key_file and not tls.cert_file:
        raise TerminalSinkError("tls_key_file is set without tls_cert_file")
    return {
        "connection_class": _VerifiedSSLConnection,
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": tls.ca_file,  # None: the system trust store alone
        "ssl_certfile": tls.cert_file,
        "ssl_keyfile": tls.key_file,
    }


def connect_url(url: str, *, password: str | None = None, username: str | None = None, socket_timeout: float = 30.0, tls: RedisTls | None = None) -> redis.Redis:
    # Retries happen in one place (sinks.retry), so redis-py's own retry is off.
    return redis.Redis.from_url(
        url,
        password=password,
        username=username,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 10.0),
        retry=Retry(NoBackoff(), 0),
        decode_responses=False,
        **_tls_options(url, tls),
    )


def node_address(url: str) -> str:
    """host:port of a Redis URL: how the driver's baselines name a server."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"


def server_address(url: str) -> str:
    """host:port/db of a Redis URL, never its credentials (for messages)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or ''}"




def connect(config: RedisSinkConfig, address: str | None = None, **overrides) -> redis.Redis:
    """A client of the configured server, or of another node at ``address`` ("host:port",
    e.g. a cluster primary), with the config's credentials, TLS and timeout."""
    options = dict(password=config.auth_password(), username=config.username, socket_timeout=config.socket_timeout, tls=config.tls)
    return connect_url(node_url(config.url, address) if address else config.url, **{**options, **overrides})


def node_url(seed_url: str, address: str) -> str:
    """The seed URL with another node's host:port (same scheme: TLS and db carry over)."""
    parts = urlsplit(seed_url)
    return urlunsplit((parts.scheme, address, parts.path, parts.query, ""))
