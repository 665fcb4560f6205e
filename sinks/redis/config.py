"""What a Redis writer is given: a frozen, picklable config built from the run
configuration, the source's definitions and the run's date (:func:`redis_sink_config`).

It is a :class:`fm_config.redis.RedisConnection` (how to reach the server; the password is
not carried, only where it is) with what a write needs on top.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, fields

from feature_defs import EntityDef, SourceDef
from fm_config import RunConf
from fm_config.redis import RedisConnection
from serializers import field_id
from serializers.horizon import as_of_horizon
from serializers.keys import as_of_epoch, freshness_field, key_prefix, subsecond_field


@dataclass(frozen=True, kw_only=True)
class RedisSinkConfig(RedisConnection):
    key_prefix: str
    """'<namespace>:<prefix>:' or '<prefix>:' put in front of every entity id."""
    fields: tuple[bytes, ...]
    """Field ids of the source's features, in column order."""
    freshness_field: bytes
    """Field id of this source's freshness field."""
    subsecond_field: bytes = b""
    """Field id of its sub-second field (a source selected by event time); b"": none (by date)."""
    as_of: int
    """Snapshot as-of time, UTC epoch seconds (the freshness value)."""
    horizon: int = field(default_factory=as_of_horizon)
    """A stored as-of time later than this is beyond any date a run accepts: corrupt, and
    replaced (serializers/horizon.py). From the driver's clock when the config is made."""
    ttl_seconds: int | None = None
    ttl_jitter: float = 0.1
    """EXPIRE gets ttl + up to this fraction of ttl, fixed per key (reruns set the same)."""
    chunk_entities: int = 500
    """Entities per pipeline round trip."""
    retries: int = 3
    ceiling_bytes: int | None = None
    """Stop when used_memory passes this (hard ceiling)."""
    recheck_every: int = 20
    """Read used_memory every N chunks."""
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


def subsecond_of(config: RedisSinkConfig, batch) -> tuple[bytes, object] | None:
    """What the write script orders writes by past the second: none for a source by date; for one
    by event time, each row's microseconds (0 where the batch has whole seconds only)."""
    if not config.subsecond_field:
        return None
    if batch.subsecond is not None:
        return config.subsecond_field, batch.subsecond
    import pyarrow as pa  # the writers' (a reader imports this module without Arrow)

    return config.subsecond_field, pa.nulls(len(batch), pa.int64()).fill_null(0)


def redis_sink_config(
    conf: RunConf,
    source: SourceDef | None = None,
    entity: EntityDef | None = None,
    date: dt.date | None = None,
    *,
    url: str | None = None,
    ceiling: int | None = None,
    connection: RedisConnection | None = None,
) -> RedisSinkConfig:
    """The writer's config for one source and date (``url``: another server than redis.url;
    ``connection``: other credentials than the run's, the server's pushes).
    Without a source: a connection's that writes nothing (verify, cleanup)."""
    settings = conf.redis
    connection = connection or conf.redis_connection(url)
    return RedisSinkConfig(
        **{f.name: getattr(connection, f.name) for f in fields(RedisConnection)},
        key_prefix=key_prefix(entity.prefix, settings.namespace) if entity else "",
        fields=tuple(field_id(f.stored_name) for f in source.features) if source else (),
        freshness_field=freshness_field(source.name) if source else b"",
        subsecond_field=subsecond_field(source.name) if source and source.by_event_time else b"",
        as_of=as_of_epoch(date) if date else 0,
        ttl_seconds=entity.ttl_seconds if entity else None,
        ttl_jitter=settings.ttl_jitter,
        chunk_entities=settings.pipeline_entities,
        retries=settings.retries,
        ceiling_bytes=ceiling,
        recheck_every=settings.recheck_every,
        wait_replicas=settings.wait_replicas,
        wait_timeout_ms=settings.wait_timeout_ms,
        failover_timeout=settings.failover_timeout,
    )
