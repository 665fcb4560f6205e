"""The Redis description of what an entity type's hashes hold (serializers/description.py):
read before a run writes, recorded right before its values. One small hash per entity
prefix, named as the prefix (``c``), read and written on the driver."""

from __future__ import annotations

import redis

from serializers.description import Description, parse_redis, redis_key_of, redis_value
from sinks.errors import TerminalSinkError
from sinks.redis.config import RedisSinkConfig
from stores.redis import connect, connect_cluster, is_cluster


def _client(config: RedisSinkConfig, cluster: bool | None):
    if cluster is None:
        probe = connect(config)
        try:
            cluster = is_cluster(probe)
        finally:
            probe.close()
    if cluster:
        return connect_cluster(config, socket_timeout=config.socket_timeout or 10.0, connect_timeout=10.0)
    return connect(config)


def read_description(config: RedisSinkConfig, cluster: bool | None = None) -> Description:
    """The entity type's description (empty: none recorded yet)."""
    client = _client(config, cluster)
    try:
        return parse_redis(client.hgetall(redis_key_of(config.key_prefix)))
    except redis.exceptions.NoPermissionError as exc:
        raise TerminalSinkError(
            f"redis: this user may not read {config.key_prefix[:-1]!r}, the hash describing the entity type's keys "
            f"(serializers/FORMAT.md): add ~{config.key_prefix[:-1]} to its ACL (conf/base/redis-acl.txt)"
        ) from exc
    except redis.RedisError as exc:
        raise TerminalSinkError(f"redis: cannot read the description at {config.key_prefix[:-1]!r}: {exc}") from exc
    finally:
        client.close()


def record_description(config: RedisSinkConfig, entries: Description, cluster: bool | None = None) -> None:
    """Record ``entries`` (stored name -> what it holds), before the values they describe."""
    if not entries:
        return
    client = _client(config, cluster)
    try:
        client.hset(redis_key_of(config.key_prefix), mapping={n.encode("utf-8"): redis_value(h) for n, h in sorted(entries.items())})
    except redis.RedisError as exc:
        raise TerminalSinkError(f"redis: cannot record the description at {config.key_prefix[:-1]!r}: {exc}") from exc
    finally:
        client.close()
