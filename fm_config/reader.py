"""The ``reader:`` section of the run configuration: which store serves each source, the
per-call deadline, and the in-process cache (``conf/base/materialize.yaml``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fm_config.base import Settings

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
    """Bytes the cache holds: each entry's values, its key and the cache's own bookkeeping; least recently used entries leave first."""
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
    max_features: int = Field(1000, ge=1)
    """Feature references in one request (a feature service counts as none: it is the
    definitions'); more is a RequestError. Raise it if a model lists more features one by one."""
    max_key_bytes: int = Field(1024, ge=64)
    """Bytes of one entity's id (its key parts joined by ':'); a longer one is an EntityKeyError naming its row."""
    max_memo_bytes: int = Field(16 << 20, ge=1 << 16)
    """Bytes of the resolved feature lists a reader keeps between requests (up to 512 lists)."""


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
