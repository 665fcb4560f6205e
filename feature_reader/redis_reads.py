"""Reads from Redis: one pipelined ``HMGET`` per entity key per batch, of the requested
fields of every source involved plus each source's freshness field, then the columns
decoded (feature_reader/decode.py).

Redis Cluster goes through redis-py's cluster client, which groups a pipeline's keys by
slot owner, sends one pipeline per primary (at once in the asyncio client) and follows
``MOVED`` and ``ASK``. The writers keep their own router (sinks/redis/router.py): they
need per-primary ceilings and WAIT, a reader needs none of that.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence

import redis
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from feature_defs import Definitions, FeatureDef
from feature_reader.decode import decode_column
from feature_reader.errors import ReadTimeout, StoreError
from feature_reader.rows import NOT_FOUND_ROW, SourceRow, Unit
from serializers import field_id
from serializers.keys import freshness_field, key_prefix, redis_key
from sinks.redis.client import _tls_options, connect_url, server_address
from sinks.redis.config import RedisSinkConfig

PER_VALUE_BYTES = 48
"""Cache size estimate per value beyond its stored bytes (Python objects)."""


class _Plan:
    """Which key and fields each unit reads, and where its fields sit in the replies."""

    def __init__(self, defs: Definitions, namespace: str | None, units: Sequence[Unit], features: dict[str, list[FeatureDef]]):
        by_key: dict[bytes, list[Unit]] = defaultdict(list)
        for unit in units:
            entity = defs.entities[defs.sources[unit.source].entity]
            by_key[redis_key(key_prefix(entity.prefix, namespace), unit.entity_id)].append(unit)
        self.keys = list(by_key)
        self.fields: list[list[bytes]] = []
        self.where: dict[Unit, tuple[int, int]] = {}  # unit -> (key index, first field index)
        ids = {name: [freshness_field(name)] + [field_id(f.name) for f in feats] for name, feats in features.items()}
        for k, key in enumerate(self.keys):
            fields: list[bytes] = []
            for unit in by_key[key]:
                self.where[unit] = (k, len(fields))
                fields += ids[unit.source]
            self.fields.append(fields)
        self.features = features

    def rows(self, replies: list[list], as_list: bool) -> dict[Unit, SourceRow]:
        """Decode the replies, a column per (source, feature) across the batch."""
        by_source: dict[str, list[Unit]] = defaultdict(list)
        for unit in self.where:
            by_source[unit.source].append(unit)
        out: dict[Unit, SourceRow] = {}
        for source, units in by_source.items():
            feats = self.features[source]
            slices = [replies[k][i : i + 1 + len(feats)] for k, i in (self.where[u] for u in units)]
            found = [s[0] is not None for s in slices]
            columns = {f.name: decode_column(f, [s[1 + j] if ok else None for s, ok in zip(slices, found)], as_list=as_list) for j, f in enumerate(feats)}
            for n, (unit, s, ok) in enumerate(zip(units, slices, found)):
                if not ok:
                    out[unit] = NOT_FOUND_ROW
                    continue
                try:
                    as_of = int(s[0])
                except ValueError:
                    as_of = None  # a freshness value no writer wrote: nothing of the source is trusted
                size = sum(len(v) for v in s if v is not None) + PER_VALUE_BYTES * len(s)
                out[unit] = SourceRow(as_of, {name: col[n] for name, col in columns.items()}, size)
        return out


def _client_options(config: RedisSinkConfig, timeout: float) -> dict:
    return dict(password=config.password, username=config.username, socket_timeout=timeout, socket_connect_timeout=max(timeout, 1.0))


class RedisReads:
    """Synchronous reads (thread-safe: redis-py pools its connections)."""

    def __init__(self, config: RedisSinkConfig, defs: Definitions, namespace: str | None, *, cluster: bool, timeout: float):
        self.defs, self.namespace, self.where = defs, namespace, server_address(config.url)
        if cluster:
            tls = {k: v for k, v in _tls_options(config.url, config.tls).items() if k != "connection_class"}
            # its own retry stays: it is what follows MOVED and ASK
            self.client = redis.RedisCluster.from_url(config.url, **_client_options(config, timeout), **tls)
        else:
            self.client = connect_url(config.url, password=config.password, username=config.username, socket_timeout=timeout, tls=config.tls)

    def read(self, units: Sequence[Unit], features: dict[str, list[FeatureDef]], as_list: bool = False) -> dict[Unit, SourceRow]:
        plan = _Plan(self.defs, self.namespace, units, features)
        pipe = self.client.pipeline(transaction=False)
        for key, fields in zip(plan.keys, plan.fields):
            pipe.hmget(key, fields)
        try:
            replies = pipe.execute()
        except redis.TimeoutError as exc:
            raise ReadTimeout(f"Redis at {self.where} did not answer in time") from exc
        except redis.RedisError as exc:
            raise StoreError(f"Redis at {self.where}: {type(exc).__name__}: {exc}") from exc
        return plan.rows(replies, as_list)

    def ping(self) -> None:
        self.client.ping()

    def close(self) -> None:
        self.client.close()


class AsyncRedisReads:
    """asyncio reads: one pipeline per batch; Redis Cluster: one per primary, at once."""

    def __init__(self, config: RedisSinkConfig, defs: Definitions, namespace: str | None, *, cluster: bool, timeout: float):
        self.defs, self.namespace, self.timeout, self.where = defs, namespace, timeout, server_address(config.url)
        tls = {k: v for k, v in _tls_options(config.url, config.tls).items() if k != "connection_class"}
        options = {**_client_options(config, timeout), **tls}
        if cluster:
            self.client = aioredis.RedisCluster.from_url(config.url, **options)
        else:
            self.client = aioredis.Redis.from_url(config.url, retry=Retry(NoBackoff(), 0), **options)

    async def read(self, units: Sequence[Unit], features: dict[str, list[FeatureDef]], as_list: bool = False) -> dict[Unit, SourceRow]:
        plan = _Plan(self.defs, self.namespace, units, features)
        pipe = self.client.pipeline(transaction=False)
        for key, fields in zip(plan.keys, plan.fields):
            pipe.hmget(key, fields)
        try:
            async with asyncio.timeout(self.timeout):
                replies = await pipe.execute()
        except (TimeoutError, redis.TimeoutError) as exc:
            raise ReadTimeout(f"Redis at {self.where} did not answer in {self.timeout * 1000:.0f} ms") from exc
        except redis.RedisError as exc:
            raise StoreError(f"Redis at {self.where}: {type(exc).__name__}: {exc}") from exc
        return plan.rows(replies, as_list)

    async def ping(self) -> None:
        await self.client.ping()

    async def close(self) -> None:
        await self.client.aclose()
