"""The ``reader:`` section of the run configuration: which store serves each source, the
per-call deadline, and the in-process cache (``conf/base/materialize.yaml``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fm_config.base import Settings
from fm_config.credentials import ReaderRedisCredentials, ReaderSqlCredentials

Store = Literal["redis", "cockroach"]


class CacheSettings(Settings):
    enabled: bool = True
    ttl_seconds: float = Field(5.0, gt=0)
    """How long a value read from a store answers again without reading it."""
    jitter: float = Field(0.1, ge=0, le=1)
    """Each entry lives ttl plus up to this fraction more, so entries read together do not expire together."""
    negative_ttl_seconds: float = Field(1.0, ge=0)
    """NOT_FOUND answers are cached this long (0: not cached)."""
    max_entries: int = Field(100_000, ge=1)
    max_bytes: int = Field(256 << 20, ge=1024)
    """Approximate bytes of the cached values; least recently used entries leave first."""
    early_refresh_beta: float = Field(1.0, ge=0)
    """Probabilistic early refresh (XFetch): a hot entry is re-read shortly before it expires,
    more eagerly the longer its read took, times this (0: off)."""
    stale_if_error_seconds: float = Field(30.0, ge=0)
    """When a store fails or times out, an entry expired less than this long ago answers
    instead, its status saying so (0: off)."""


class ReaderSettings(Settings):
    stores: dict[str, list[Store]] = {}
    """Per source: the stores that serve it (default: the run's ``sinks``); Redis is read first."""
    read_through: bool = True
    """A source served by Redis and the SQL store: entities Redis does not hold are read from SQL."""
    timeout_ms: float = Field(50.0, gt=0)
    """Deadline of one store call; past it the call fails with ReadTimeout (or stale values answer)."""
    max_entities: int = Field(1000, ge=1)
    """Entities in one request; more is a RequestError."""
    redis_connections: int = Field(32, ge=1)
    """Reads one asyncio reader sends to Redis at once (they share one connection; in a
    cluster, connections per node); more callers wait."""
    sql_connections: int = Field(4, ge=1)
    """Connections to the SQL store held by one reader."""
    embeddings: Literal["numpy", "list"] = "numpy"
    """Embeddings as float32 numpy arrays, or as lists of floats."""
    single_flight: bool = True
    """Concurrent reads of one (source, entity) make one store read; the others wait for it."""
    cache: CacheSettings = CacheSettings()
    redis: ReaderRedisCredentials | None = None
    """Who reads Redis (an ACL user that may only read: conf/base/redis-acl.txt); unset: redis.username and its password."""
    sql: ReaderSqlCredentials | None = None
    """Who reads the SQL store (a SELECT-only role: conf/base/sql-grants.sql); unset: sql.dsn's user and its password."""
    connect_timeout_ms: float = Field(1000.0, gt=0)
    """A new connection's connect, TLS handshake and login; not counted against ``timeout_ms``
    (connections are opened at start and reopened in the background after a drop)."""
    fallback: bool = True
    """A Redis read that fails or times out, of a source the SQL store holds too, is read
    from the SQL store instead (also while Redis's breaker is open)."""
    breaker_failures: int = Field(5, ge=1)
    """Consecutive failed calls that open a store's circuit breaker: its calls then fail at
    once (or go to the fallback) for ``breaker_cooldown_ms``, then one call probes it."""
    breaker_cooldown_ms: float = Field(1000.0, gt=0)


class ServerSettings(Settings):
    """``server:`` of the run configuration: ``materialize serve`` (feature_reader/server.py)."""

    host: str = "127.0.0.1"
    port: int = Field(6566, ge=0, le=65535)
    """Feast's feature server port."""
    max_body_bytes: int = Field(1 << 20, ge=1024)
    """A larger request body is refused (413) before it is read whole."""
    deadline_ms: float = Field(1000.0, gt=0)
    """A request still unanswered past this is answered 504 (its reads go on for their waiters)."""
    max_in_flight: int = Field(256, ge=1)
    """Requests being answered at once; more are refused at once with 503 (back-pressure, not a queue that grows)."""
    health_cache_ms: float = Field(1000.0, ge=0)
    """``/health`` and ``/health/ready`` answer from the last store check for this long
    (unless a store call failed since: probes at any rate cost the stores one check per
    period; 0: every probe checks)."""
