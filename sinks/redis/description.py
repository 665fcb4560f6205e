"""The Redis description of what an entity type's hashes hold (serializers/description.py):
read before a run writes, recorded right before its values. One small hash per entity
prefix, named as the prefix (``c``), read and written on the driver, on the node that owns
it (the writers' own router: no cluster client, whose start-up asks every node for more)."""

from __future__ import annotations

import redis

from serializers.description import Description, parse_redis, redis_key_of, redis_value
from sinks.errors import TerminalSinkError, TransientSinkError
from sinks.redis.config import RedisSinkConfig
from sinks.redis.router import KeyRouter, cluster_mode


def _one(config: RedisSinkConfig, cluster: bool | None, add):
    key = redis_key_of(config.key_prefix)
    router = KeyRouter(config, cluster_mode(config, cluster))
    try:
        return router.run([key], add)[0]
    except redis.exceptions.NoPermissionError as exc:
        raise TerminalSinkError(
            f"redis: this user may not use {key.decode()!r}, the hash describing the entity type's keys "
            f"(serializers/FORMAT.md): add ~{key.decode()} to its ACL (conf/base/redis-acl.txt)"
        ) from exc
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # a rerun may find it up: transient
        raise TransientSinkError(f"redis: the description at {key.decode()!r}: {exc}") from exc
    except redis.RedisError as exc:
        raise TerminalSinkError(f"redis: the description at {key.decode()!r}: {exc}") from exc
    finally:
        router.close()


def read_description(config: RedisSinkConfig, cluster: bool | None = None) -> Description:
    """The entity type's description (empty: none recorded yet)."""
    return parse_redis(_one(config, cluster, lambda pipe, key: pipe.hgetall(key)))


def record_description(config: RedisSinkConfig, entries: Description, cluster: bool | None = None) -> None:
    """Record ``entries`` (stored name -> what it holds), before the values they describe."""
    if entries:
        fields = {n.encode("utf-8"): redis_value(h) for n, h in sorted(entries.items())}
        _one(config, cluster, lambda pipe, key: pipe.hset(key, mapping=fields))
