"""Connections to Redis, for every part alike: the writers on the executors, every
driver-side step (preflight, verify, cleanup, doctor) and the readers, sync and asyncio,
standalone and Redis Cluster. TLS is always verified, credentials are never in URLs or
messages, and redis-py's own retry is off for a single server (retries happen in one
place, :mod:`sinks.retry`; the cluster clients keep theirs: it is what follows MOVED and ASK).
"""

from __future__ import annotations

import os
import ssl
import time
from collections.abc import Sequence
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis
import redis.asyncio as aioredis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from fm_config.redis import RedisConnection, RedisTls
from stores.errors import TerminalError

TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)
"""redis-py errors that a later attempt may not see (a refused password aside: see is_transient)."""


def is_transient(exc: BaseException) -> bool:
    # a refused password is a ConnectionError to redis-py, but no retry fixes it
    return isinstance(exc, TRANSIENT) and not isinstance(exc, redis.AuthenticationError)


LOADING_WAIT_S = 60.0
"""How long a caller waits for a restarted server to load its data before giving up (transient)."""


def info_once_loaded(client: redis.Redis, *sections: str, wait_s: float = LOADING_WAIT_S) -> dict:
    """``INFO`` of ``sections`` (persistence among them) once the server has loaded its data.

    While Redis loads an append-only file at start it answers INFO but turns AOF off until
    the load ends (``aof_enabled:0``, ``loading:1``): read then, a restarted server with
    persistence looks like one without, and a writer would stop a run that can go on."""
    deadline = time.monotonic() + wait_s
    while True:
        info = client.info(*sections, "persistence")
        if not int(info.get("loading", 0)):
            return info
        if time.monotonic() >= deadline:
            raise redis.BusyLoadingError(f"Redis is still loading its data after {wait_s:g} s")
        time.sleep(0.1)


class TlsVerificationError(TerminalError):
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


def tls_options(url: str, tls: RedisTls | None) -> dict:
    """redis-py arguments for the URL: verified TLS for rediss://, and TLS files only there."""
    parts = urlsplit(url)
    # redis-py lets URL query arguments win over keyword ones (?ssl_cert_reqs=none would)
    overrides = sorted(k for k in parse_qs(parts.query) if k.startswith("ssl_"))
    if overrides:
        raise TerminalError(f"the Redis URL sets {', '.join(overrides)}: TLS is configured with redis.tls_* only, and is always verified")
    tls = tls or RedisTls()
    files = tls.files()
    if parts.scheme != "rediss":
        if files:
            raise TerminalError(
                f"{', '.join(files)} set, but the Redis URL {server_address(url)} is not rediss://: refusing to connect without TLS"
            )
        return {"connection_class": _PlainConnection} if parts.scheme == "redis" else {}
    missing = [f"{name} {path}" for name, path in files.items() if not os.path.isfile(path)]
    if missing:
        raise TerminalError(f"Redis TLS file(s) not found on this host: {', '.join(missing)}")
    if tls.key_file and not tls.cert_file:
        raise TerminalError("tls_key_file is set without tls_cert_file")
    return {
        "connection_class": _VerifiedSSLConnection,
        "ssl_cert_reqs": "required",
        "ssl_check_hostname": True,
        "ssl_ca_certs": tls.ca_file,  # None: the system trust store alone
        "ssl_certfile": tls.cert_file,
        "ssl_keyfile": tls.key_file,
    }


def connect_url(
    url: str,
    *,
    password: str | None = None,
    username: str | None = None,
    socket_timeout: float = 30.0,
    connect_timeout: float | None = None,
    tls: RedisTls | None = None,
) -> redis.Redis:
    """A client of one server. ``connect_timeout``: the connect and TLS handshake's own
    bound (default: the socket timeout, at most 10 s)."""
    # Retries happen in one place (sinks.retry), so redis-py's own retry is off.
    return redis.Redis.from_url(
        url,
        **_common(password, username, socket_timeout, min(socket_timeout, 10.0) if connect_timeout is None else connect_timeout),
        retry=Retry(NoBackoff(), 0),
        decode_responses=False,
        **tls_options(url, tls),
    )


def _common(password: str | None, username: str | None, socket_timeout: float, connect_timeout: float) -> dict:
    # TCP keepalive: a server that vanished without a reset (a dead node, a partition) is
    # noticed by the kernel on an idle connection, not at the next read's timeout
    return dict(
        password=password, username=username, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout, socket_keepalive=True
    )


def node_address(url: str) -> str:
    """host:port of a Redis URL: how the driver's baselines name a server."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 6379}"


def server_address(url: str) -> str:
    """host:port/db of a Redis URL, never its credentials (for messages)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or 6379}{parts.path or ''}"


def connect(config: RedisConnection, address: str | None = None, **overrides) -> redis.Redis:
    """A client of the configured server, or of another node at ``address`` ("host:port",
    e.g. a cluster primary), with the config's credentials, TLS and timeouts."""
    options = dict(password=config.auth_password(), username=config.username, socket_timeout=config.socket_timeout, tls=config.tls)
    return connect_url(node_url(config.url, address) if address else config.url, **{**options, **overrides})


def client_options(config: RedisConnection, socket_timeout: float, connect_timeout: float) -> dict:
    """redis-py keyword arguments of every other client kind (asyncio, cluster): credentials,
    timeouts and verified TLS (redis-py picks the TLS connection class itself there)."""
    tls = {k: v for k, v in tls_options(config.url, config.tls).items() if k != "connection_class"}
    return {**_common(config.auth_password(), config.username, socket_timeout, connect_timeout), **tls}


def connect_async(config: RedisConnection, *, socket_timeout: float, connect_timeout: float, max_connections: int) -> aioredis.Redis:
    """An asyncio client of one server (redis-py's retry off, as for :func:`connect`)."""
    options = client_options(config, socket_timeout, connect_timeout)
    pool = aioredis.ConnectionPool.from_url(config.url, max_connections=max_connections, retry=Retry(NoBackoff(), 0), **options)
    return aioredis.Redis(connection_pool=pool)


def connect_cluster(
    config: RedisConnection, *, socket_timeout: float, connect_timeout: float, seeds: Sequence[tuple[str, int]] = ()
) -> redis.RedisCluster:
    """A Redis Cluster client seeded by the config's URL and ``seeds`` (host, port) besides: a
    client made while the URL's node is down finds the cluster through the others (its own
    retry follows MOVED and ASK)."""
    nodes = [redis.cluster.ClusterNode(host, port) for host, port in seeds]
    return redis.RedisCluster.from_url(config.url, startup_nodes=nodes, **client_options(config, socket_timeout, connect_timeout))


def known_nodes(client) -> list[tuple[str, int]]:
    """The (host, port) of every node a cluster client (sync or asyncio) knows: seeds for another client."""
    return [(node.host, node.port) for node in client.nodes_manager.nodes_cache.values()]


def connect_cluster_async(
    config: RedisConnection, *, socket_timeout: float, connect_timeout: float, max_connections: int
) -> aioredis.RedisCluster:
    """The asyncio Redis Cluster client: ``max_connections`` per node."""
    return aioredis.RedisCluster.from_url(
        config.url, max_connections=max_connections, **client_options(config, socket_timeout, connect_timeout)
    )


def is_cluster(client: redis.Redis) -> bool:
    """Whether the server runs in cluster mode (INFO cluster)."""
    return bool(int(client.info("cluster").get("cluster_enabled", 0)))


def node_url(seed_url: str, address: str) -> str:
    """The seed URL with another node's host:port (same scheme: TLS and db carry over)."""
    parts = urlsplit(seed_url)
    return urlunsplit((parts.scheme, address, parts.path, parts.query, ""))
