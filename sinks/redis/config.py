"""What a Redis writer is given: a frozen, picklable config built from the ``redis:``
settings, the source's definitions and the run's date (:func:`sink_config`).

The password is not carried here: ``secret`` names where it is (env var or mounted file),
and each executor reads it there when it connects (``auth_password()``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from feature_defs import EntityDef, SourceDef
from serializers import field_id
from serializers.keys import as_of_epoch, freshness_field, key_prefix
from sinks.redis.settings import RedisSettings
from sinks.settings import SecretRef


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
        return {name: path for name, path in (("tls_ca_file", self.ca_file), ("tls_cert_file", self.cert_file), ("tls_key_file", self.key_file)) if path}


@dataclass(frozen=True)
class RedisSinkConfig:
    url: str
    """redis:// or rediss:// URL (no password in it: see password)."""
    key_prefix: str
    """'<namespace>:<prefix>:' or '<prefix>:' put in front of every entity id."""
    fields: tuple[bytes, ...]
    """Field ids of the source's features, in column order."""
    freshness_field: bytes
    """Field id of this source's freshness field."""
    as_of: int
    """Snapshot as-of time, UTC epoch seconds (the freshness value)."""
    ttl_seconds: int | None = None
    ttl_jitter: float = 0.1
    """EXPIRE gets ttl + up to this fraction of ttl, fixed per key (reruns set the same)."""
    chunk_entities: int = 500
    """Entities per pipeline round trip."""
    retries: int = 3
    socket_timeout: float = 30.0
    ceiling_bytes: int | None = None
    """Stop when used_memory passes this (hard ceiling)."""
    recheck_every: int = 20
    """Read used_memory every N chunks."""
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    """A literal password (programs that build a config themselves); the conf's is ``secret``."""
    secret: SecretRef | None = None
    """Where the password is (env var or mounted file), read where the connection is made."""
    tls: RedisTls | None = None
    """rediss:// only: what the server's certificate is verified with (None: system trust store)."""
    cluster: bool = False
    """Redis Cluster: the URL is a seed node; writes go to each key's slot owner."""
    node_ceilings: tuple[tuple[str, int], ...] = ()
    """Cluster: hard ceiling per primary ("host:port", bytes); ceiling_bytes for any other."""
    wait_replicas: int = 0
    """After each chunk, WAIT until this many replicas have it (at most those attached when
    the writer connected): a primary that dies mid-write then loses nothing acknowledged."""
    wait_timeout_ms: int = 5000
    failover_timeout: float = 60.0
    """Cluster: how long to wait for a replica to take over the slots of a lost primary."""
    run_ids: tuple[tuple[str, str], ...] = ()
    """("host:port", run_id) of each server as the driver saw it before any write: a server
    whose run_id differs later restarted during the run."""
    evicted_keys: tuple[tuple[str, int], ...] = ()
    """("host:port", evicted_keys) before any write: growth means Redis evicted keys."""
    stop_on_eviction: bool = True
    """Stop the writer when evicted_keys grew (redis.eviction: refuse)."""

    def auth_password(self) -> str | None:
        """The password to connect with: the literal one, else the secret's, read here (an
        executor reads its own environment or mounted file)."""
        return self.password if self.password is not None else self.secret.value() if self.secret else None


def tls_files(settings: RedisSettings, resolve: Callable[[str], Path]) -> RedisTls:
    """The redis.tls_* files, relative ones placed by ``resolve`` (under the project root:
    executors may run elsewhere)."""
    ca, cert, key = (str(resolve(v)) if v else None for v in (settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file))
    return RedisTls(ca_file=ca, cert_file=cert, key_file=key)


def sink_config(
    settings: RedisSettings,
    source: SourceDef | None,
    entity: EntityDef | None,
    date: dt.date | None,
    *,
    secret: SecretRef | None,
    resolve: Callable[[str], Path],
    url: str | None = None,
    ceiling: int | None = None,
) -> RedisSinkConfig:
    """The writer's config for one source and date (``url``: another server than redis.url).
    Without a source: a connection's that writes nothing (verify, cleanup, the reader)."""
    return RedisSinkConfig(
        url=url or settings.url,
        key_prefix=key_prefix(entity.prefix, settings.namespace) if entity else "",
        fields=tuple(field_id(f.name) for f in source.features) if source else (),
        freshness_field=freshness_field(source.name) if source else b"",
        as_of=as_of_epoch(date) if date else 0,
        ttl_seconds=entity.ttl_seconds if entity else None,
        ttl_jitter=settings.ttl_jitter,
        chunk_entities=settings.pipeline_entities,
        retries=settings.retries,
        socket_timeout=settings.socket_timeout,
        ceiling_bytes=ceiling,
        recheck_every=settings.recheck_every,
        username=settings.username,
        secret=secret,
        tls=tls_files(settings, resolve),
        wait_replicas=settings.wait_replicas,
        wait_timeout_ms=settings.wait_timeout_ms,
        failover_timeout=settings.failover_timeout,
    )
