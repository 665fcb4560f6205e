"""The ``redis:`` section of the run configuration (conf/README.md documents every key),
and what a connection to that server is made from (:class:`RedisConnection`: frozen and
picklable, the writers' configs extend it; ``stores/redis.py`` makes the clients)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, model_validator

from feature_defs.yamlio import KeyProblem
from fm_config.base import Credentials, Settings, read_secret

Fraction = Annotated[float, Field(gt=0, le=1)]


class RedisSettings(Settings):
    url: str = "redis://127.0.0.1:6379/0"
    password_env: str | None = None
    """Env var holding the Redis password (AUTH); unset means no password."""
    password_file: str | None = None
    """Or: a file holding the password (e.g. a mounted secret); trailing newline ignored."""

    @model_validator(mode="after")
    def _no_password_in_url(self) -> RedisSettings:
        from urllib.parse import parse_qs, urlsplit

        try:
            parts = urlsplit(self.url)
            secret = parts.password
        except ValueError:
            raise KeyProblem("url", "url is not a valid redis:// or rediss:// URL") from None
        # redis-py also takes credentials from query arguments (?password=...)
        if secret or {"password", "username", "credential_provider"} & set(parse_qs(parts.query)):
            raise KeyProblem(
                "url",
                "url contains a password: secrets are never read from config or flags; name the env var that holds it with 'password_env'",
            )
        return self

    username: str | None = None
    mode: Literal["auto", "standalone", "cluster"] = "auto"
    """cluster: the url is a seed node of a Redis Cluster; auto: ask the server (INFO cluster)."""
    wait_replicas: int = Field(0, ge=0)
    """After each chunk, WAIT for this many replicas (at most those attached): a primary that
    dies mid-write loses nothing it acknowledged. 0: asynchronous replication, fastest."""
    wait_timeout_ms: int = Field(5000, ge=1)
    failover_timeout: float = Field(60.0, gt=0)
    """Cluster: seconds to wait for a replica to take over a lost primary's slots (Redis's
    cluster-node-timeout, 15 s by default, plus the election)."""
    namespace: Annotated[str, Field(pattern=r"^[a-z0-9_]{1,32}$")] | None = None
    """Optional deployment namespace put in front of every key."""
    pipeline_entities: int = Field(500, ge=1)
    """Entities per pipeline round trip (each is HSET + HDEL? + EXPIRE)."""
    max_fill: Fraction = 0.85
    """Refuse a write whose projection passes this fraction of capacity."""
    hard_fill: Fraction = 0.95
    """Stop a running write when used memory passes this fraction of capacity."""
    capacity_bytes: int | None = Field(None, gt=0)
    """Capacity when the server has no maxmemory; required then."""
    hash_max_listpack_entries: int | None = Field(None, ge=1)
    hash_max_listpack_value: int | None = Field(None, ge=1)
    """The server's hash-max-listpack-* for the capacity check when CONFIG GET is refused
    (a least-privilege user); unset: Redis's defaults 512 / 64 are assumed."""
    recheck_every: int = Field(20, ge=1)
    """Re-read used memory (and evicted_keys) every N pipeline chunks during the write."""
    eviction: Literal["refuse", "warn"] = "refuse"
    """When the server's maxmemory-policy may evict this run's keys (allkeys-*, or volatile-*
    for an entity type with a TTL): refuse to write, or write with a warning. Either way a
    run during which such a server evicted keys fails."""
    sample_entities: int = Field(1000, ge=10)
    """Entities encoded on the driver to project the write's memory growth."""
    ttl_jitter: float = Field(0.1, ge=0, le=1)
    socket_timeout: float = Field(30.0, gt=0)
    retries: int = Field(3, ge=0)
    """Retries of a chunk after a dropped connection (writes are idempotent)."""
    cleanup_keys_per_second: float | None = Field(50_000, gt=0)
    """`materialize cleanup`: keys visited per second per Spark task at most (None: no limit)."""
    tls_ca_file: str | None = None
    """rediss:// only: PEM bundle of the CA(s) the server's certificate is verified with
    (hostname included), on top of the system trust store; unset: the system trust store."""
    tls_cert_file: str | None = None
    """rediss:// only: client certificate (PEM), for servers that ask for one."""
    tls_key_file: str | None = None
    """Unencrypted PEM key of tls_cert_file, when the key is not in that file."""

    def password(self, resolve: Callable[[str], Path]) -> SecretStr | None:
        """The password from password_env or password_file (``resolve`` places a relative file)."""
        return read_secret("redis", self.password_env, resolve(self.password_file) if self.password_file else None)


@dataclass(frozen=True)
class RedisTls:
    """Client side of rediss://. The server's certificate is always verified, hostname
    included: there is no setting that turns verification off."""

    ca_file: str | None = None
    """PEM CA bundle trusted on top of the system trust store; None: the system store alone."""
    cert_file: str | None = None
    """Client certificate (PEM), for servers that ask for one."""
    key_file: str | None = None
    """Unencrypted PEM key of cert_file, when the key is not in that file."""

    def files(self) -> dict[str, str]:
        return {
            name: path
            for name, path in (("tls_ca_file", self.ca_file), ("tls_cert_file", self.cert_file), ("tls_key_file", self.key_file))
            if path
        }


@dataclass(frozen=True, kw_only=True)
class RedisConnection(Credentials):
    """How to reach one Redis deployment: what readers and writers connect with.

    The password is not carried here: ``secret`` names where it is (env var or mounted
    file), read wherever the connection is made (``auth_password()``, :class:`Credentials`)."""

    url: str
    """redis:// or rediss:// URL (no password in it: see password)."""
    username: str | None = None
    tls: RedisTls | None = None
    """rediss:// only: what the server's certificate is verified with (None: system trust store)."""
    socket_timeout: float = 30.0


def tls_files(settings: RedisSettings, resolve: Callable[[str], Path]) -> RedisTls:
    """The redis.tls_* files, relative ones placed by ``resolve`` (under the project root:
    executors may run elsewhere)."""
    ca, cert, key = (str(resolve(v)) if v else None for v in (settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file))
    return RedisTls(ca_file=ca, cert_file=cert, key_file=key)
