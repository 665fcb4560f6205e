"""The ``reader:`` section of the run configuration: which store serves each source, the
per-call deadline, and the in-process cache (``conf/base/materialize.yaml``)."""

from __future__ import annotations

import ipaddress
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, model_validator

from feature_defs.yamlio import KeyProblem
from fm_config.base import Settings
from fm_config.credentials import PushRedisCredentials, PushSqlCredentials, ReaderRedisCredentials, ReaderSqlCredentials
from fm_config.stores import StoreName as Store


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
    max_features: int = Field(1000, ge=1)
    """Feature references in one request (a feature service counts as none: it is the
    definitions'); more is a RequestError. Raise it if a model lists more features one by one."""
    max_key_bytes: int = Field(1024, ge=64)
    """Bytes of one entity's id (its key parts joined by ':'); a longer one is an EntityKeyError naming its row."""
    max_memo_bytes: int = Field(16 << 20, ge=1 << 16)
    """Bytes of the resolved feature lists a reader keeps between requests (up to 512 lists)."""
    description_refresh_seconds: float = Field(30.0, gt=0, le=3600)
    """How often each store's description of what it holds is read again (it is read first
    at the first read of the store): a feature it holds as another encoding answers INVALID."""
    clock_skew_seconds: float = Field(300.0, ge=0, le=86400)
    """How far the writers' clocks may run ahead of this reader's: a source's as-of time
    later than that of the latest date a run accepts (tomorrow, UTC) at this reader's clock
    plus this is corrupt: INVALID, counted in ``bad_freshness`` (serializers/horizon.py;
    the writers allow CLOCK_SKEW_SECONDS, 300, the same)."""


class ServerTlsSettings(Settings):
    """``server.tls``: HTTPS instead of HTTP when ``cert_file`` is set (feature_reader/README.md)."""

    cert_file: str | None = None
    """PEM certificate (chain) of the server; relative paths from the project root."""
    key_file: str | None = None
    """PEM private key of that certificate (unencrypted: mount it readable by the server only)."""
    client_ca_file: str | None = None
    """PEM CA(s) that sign client certificates: when set, clients present one (mutual TLS)."""
    client_cert: Literal["required", "optional"] = "required"
    """With ``client_ca_file``: a client without a certificate is refused (required), or let in (optional)."""
    expiry_warn_days: int = Field(14, ge=0)
    """``materialize doctor`` warns when the certificate expires within this many days."""

    @model_validator(mode="after")
    def _pairs(self) -> ServerTlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise KeyProblem("cert_file", "server.tls needs both cert_file and key_file (or neither: plain HTTP)")
        if self.client_ca_file and not self.cert_file:
            raise KeyProblem(
                "client_ca_file", "server.tls.client_ca_file needs cert_file and key_file (client certificates are a TLS feature)"
            )
        return self


class Grant(Settings):
    """What the holders of one claim value may read ("*": all), and push to."""

    sources: list[str] = []
    feature_services: list[str] = []
    push: list[str] = []
    """Sources its holders may push to (server.push); reading them is granted apart."""


class PushSettings(Settings):
    """``server.push``: Feast's push API on the server (feature_push/README.md). Off, the
    server holds no writer credentials at all."""

    enabled: bool = False
    max_rows: int = Field(1000, ge=1)
    """Rows in one push; more is refused (413) before any is looked at."""
    max_in_flight: int = Field(8, ge=1)
    """Pushes being answered at once, counted within ``server.max_in_flight`` too; more are
    refused at once with 503: reads keep the rest, whatever the push load."""
    store_timeout_ms: int = Field(5000, ge=100)
    """A push's SQL statement (a wait for a row lock included) is cancelled past this: 503,
    retry; the run's ``sql.statement_timeout_ms`` is for nightly batches, not for a caller waiting."""
    clock_skew_seconds: float = Field(300.0, ge=0, le=86_400)
    """A pushed event time may be this much later than the server's clock, no more (Feast's
    pushes are "now"; a later one would hold the entity against the nightly runs)."""
    offline: bool = True
    """``to: offline`` / ``online_and_offline`` append to the source's table (Delta, or a
    folder of Parquet files); False: refused (the push says so)."""
    redis: PushRedisCredentials | None = None
    """Who pushes write Redis as; unset: redis.username and its password (the run's writer)."""
    sql: PushSqlCredentials | None = None
    """Who pushes write the SQL store as; unset: sql.dsn's user and its password."""


def fetched_safely(url: str) -> bool:
    """https, or http to a loopback host (by the parsed host: http://localhost@elsewhere/ is elsewhere)."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return True
    if parts.scheme != "http" or not parts.hostname:
        return False
    if parts.hostname == "localhost":
        return True
    try:
        return ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        return False


SAFE_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
"""Signature algorithms with a public key: a token is never checked with a shared secret."""


class ServerAuthSettings(Settings):
    """``server.auth``: bearer tokens (JWTs) on /get-online-features (feature_reader/README.md "Authentication")."""

    mode: Literal["jwt", "none"] | None = None
    """jwt: every read carries a JWT verified against the JWKS; none: no authentication, said on
    purpose; unset: none on a loopback address, and ``materialize serve`` refuses to start on any other."""
    jwks_file: str | None = None
    """The public keys as a JWKS (JSON) file; relative paths from the project root."""
    jwks_url: str | None = None
    """Or: the identity provider's JWKS URL (https), fetched at start and every ``jwks_refresh_seconds``."""
    jwks_timeout_seconds: float = Field(2.0, gt=0, le=30)
    jwks_refresh_seconds: float = Field(300.0, ge=1)
    """Keys are fetched again this often (the last ones kept while the URL is down); a token whose key id
    is unknown fetches them at once, at most every 30 s."""
    issuer: str | None = None
    """The ``iss`` every token must carry (required with mode jwt)."""
    audience: list[str] = []
    """``aud`` values accepted (a token must name one; required with mode jwt)."""
    algorithms: list[str] = ["RS256", "ES256"]
    """Signature algorithms accepted: asymmetric ones only (never "none", never HS*)."""
    leeway_seconds: float = Field(30.0, ge=0, le=300)
    """Clock skew allowed on exp, nbf and iat."""
    claim: str = "roles"
    """The claim whose values are looked up in ``grants``: a list, or a space-separated string (OAuth's ``scope``)."""
    grants: dict[str, Grant] = {}
    """Claim value -> the sources and feature services its holders may read; a caller gets the union of its values' grants."""
    cache_entries: int = Field(10_000, ge=0)
    """Verified tokens kept (each until it expires); 0: every request verifies its token."""
    metrics: Literal["open", "authenticated"] = "open"
    """/metrics open (Prometheus scrapes without a token) or behind the token like reads."""

    @model_validator(mode="after")
    def _complete(self) -> ServerAuthSettings:
        bad = [a for a in self.algorithms if a not in SAFE_ALGORITHMS]
        if bad:
            raise KeyProblem(
                "algorithms", f"server.auth.algorithms: {', '.join(bad)} refused (asymmetric only: {', '.join(SAFE_ALGORITHMS)})"
            )
        if self.mode != "jwt":
            return self
        if (self.jwks_file is None) == (self.jwks_url is None):
            raise KeyProblem("jwks_file", "server.auth.mode jwt needs exactly one of jwks_file or jwks_url")
        if self.jwks_url and not fetched_safely(self.jwks_url):
            raise KeyProblem(
                "jwks_url", "server.auth.jwks_url must be https:// (keys fetched in clear could be replaced; http on loopback only)"
            )
        if not self.issuer or not self.audience:
            raise KeyProblem("issuer", "server.auth.mode jwt needs issuer and audience (a token for another service must not read here)")
        if not self.grants:
            raise KeyProblem(
                "grants", "server.auth.mode jwt needs grants: claim value -> {sources: [...], feature_services: [...], push: [...]}"
            )
        return self


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
    read_timeout_ms: float = Field(10_000.0, gt=0)
    """A request's head and body must arrive within this of its first byte; past it 408 and the connection closes."""
    idle_timeout_ms: float = Field(65_000.0, gt=0)
    """A connection with no request under way is closed after this (longer than a load balancer's usual 60 s, so it closes first)."""
    write_timeout_ms: float = Field(10_000.0, gt=0)
    """An answer must leave for the client's socket within this of being written; past it the
    connection is dropped (a client that stops reading pins nothing longer)."""
    max_unsent_bytes: int = Field(64 << 20, ge=0)
    """Answer bytes waiting for slow clients, over all connections of a worker; past this new
    requests and connections get 503 and are closed."""
    max_connections: int = Field(1024, ge=1)
    """Open connections per worker; a new one past this is answered 503 and closed."""
    max_header_bytes: int = Field(16_384, ge=1024)
    """The request line and headers together; more is refused with 431 and the connection closes."""
    max_headers: int = Field(100, ge=1)
    """Header lines in one request; more is refused with 431."""
    shutdown_grace_ms: float = Field(10_000.0, ge=0)
    """On SIGTERM, requests being answered get this long to finish; then they are answered 503 and the process stops."""
    require_content_type: bool = False
    """A POST with no Content-Type is refused (415) too; off since Feast's remote client sends none (any other non-JSON type is 415)."""
    tls: ServerTlsSettings = ServerTlsSettings()
    auth: ServerAuthSettings = ServerAuthSettings()
    push: PushSettings = PushSettings()

    @model_validator(mode="after")
    def _pushes_within(self) -> ServerSettings:
        if self.push.enabled and self.push.max_in_flight >= self.max_in_flight:
            raise KeyProblem(
                "push",
                f"server.push.max_in_flight ({self.push.max_in_flight}) must be below server.max_in_flight "
                f"({self.max_in_flight}): pushes take at most that many of the server's requests, reads keep the rest",
            )
        return self
