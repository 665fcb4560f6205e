"""FeatureReader (threads) and AsyncFeatureReader (asyncio): L1 cache -> Redis -> SQL.

A request names features and entities in Feast's shape (feature_reader/request.py). Each
(source, entity) it needs is looked up in the L1 cache; the misses are claimed on the
single-flight scoreboard (a key another caller is reading is waited for, not read again),
read from the source's stores in one batch per store (Redis first; for a source in both
stores, what Redis does not hold is read from SQL), put in the cache, and the columns are
assembled with Feast's statuses. A store failure serves expired entries within the
stale-if-error window, and fails the call otherwise.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from feature_defs import Definitions, FeatureDef, load_definitions
from feature_reader.cache import FRESH, MISS, REFRESH, STALE, L1Cache
from feature_reader.decode import BAD
from feature_reader.errors import RequestError, StoreError
from feature_reader.redis_reads import AsyncRedisReads, RedisReads
from feature_reader.request import ReadRequest, parse_request
from feature_reader.response import INVALID, NOT_FOUND, NULL_VALUE, OUTSIDE_MAX_AGE, PRESENT, FeatureColumn, OnlineFeatures
from feature_reader.response import STALE as STALE_STATUS
from feature_reader.rows import SourceRow, Unit
from feature_reader.singleflight import AsyncFlights, ThreadFlights
from feature_reader.sql_reads import AsyncSqlReads, SqlReads

if TYPE_CHECKING:  # jobs.config reads this package's settings: imported when used
    from jobs.config import RunConf

STORES = {"redis": "redis", "sql": "cockroach", "cockroach": "cockroach"}
"""--store names (and the conf's sink names) -> sink name."""

Key = tuple  # (route, source, entity_id): what the cache and the scoreboard are keyed by


class _Core:
    """What both readers share: routing, the cache, counting, the columns."""

    def __init__(self, conf: RunConf, defs: Definitions, *, cache: bool | None, clock=time.time):
        self.conf, self.defs, self.settings = conf, defs, conf.reader
        enabled = self.settings.cache.enabled if cache is None else cache
        self.cache = L1Cache(self.settings.cache) if enabled else None
        self.clock = clock
        self.counters: Counter = Counter()
        self.as_list = self.settings.embeddings == "list"

    def route(self, source: str, store: str | None) -> tuple[str, ...]:
        if store is not None:
            if store not in STORES:
                raise RequestError(f"unknown store {store!r}; use redis or sql")
            return (STORES[store],)
        stores = self.settings.stores.get(source) or self.conf.sinks
        ordered = tuple(s for s in ("redis", "cockroach") if s in stores)
        return ordered if self.settings.read_through else ordered[:1]

    def keys(self, req: ReadRequest, store: str | None) -> list[Key]:
        """Every (route, source, entity) the request needs, each once, in order."""
        out: dict[Key, None] = {}
        for name, source in req.sources.items():
            route = self.route(name, store)
            for eid in req.ids[source.entity]:
                out[(route, name, eid)] = None
        return list(out)

    def features(self, req: ReadRequest) -> dict[str, list[FeatureDef]]:
        """Per source, the features a store read fetches: all of them when the cache keeps
        the entry (it answers later requests for others), else only those asked for."""
        if self.cache is not None:
            return {name: list(s.features) for name, s in req.sources.items()}
        out: dict[str, list[FeatureDef]] = defaultdict(list)
        for c in req.columns:
            out[c.source.name].append(c.feature)
        return dict(out)

    def lookup(self, keys: list[Key]) -> tuple[dict[Key, SourceRow], list[Key], dict[Key, SourceRow], list[Key]]:
        """(answers, misses, stale entries of the misses, keys to refresh early)."""
        if self.cache is None:
            self.counters["misses"] += len(keys)
            return {}, list(keys), {}, []
        answers, misses, stale, refresh = {}, [], {}, []
        for key in keys:
            state, entry = self.cache.lookup(key)
            if state == FRESH or state == REFRESH:
                answers[key] = entry.value
                if state == REFRESH:
                    refresh.append(key)
            else:
                misses.append(key)
                if state == STALE:
                    stale[key] = entry.value
        self.counters["hits"] += len(answers)
        self.counters["misses"] += len(misses)
        self.counters["early_refreshes"] += len(refresh)
        return answers, misses, stale, refresh

    def keep(self, rows: dict[Key, SourceRow], seconds: float) -> None:
        if self.cache is None:
            return
        for key, row in rows.items():
            self.cache.put(key, row, size=row.size, negative=row.as_of is None, delta=seconds)

    def stale_or_raise(self, keys: Sequence[Key], stale: dict[Key, SourceRow], error: BaseException, out: dict) -> None:
        """Expired entries answer for ``keys`` when the store failed; any key without one fails the call."""
        self.counters["errors"] += 1
        missing = [k for k in keys if k not in stale]
        if missing:
            raise error
        for k in keys:
            out[k] = replace(stale[k], stale=True)
        self.counters["stale_served"] += len(keys)

    def by_store(self, keys: Sequence[Key]) -> dict[tuple[str, ...], list[Key]]:
        groups: dict[tuple[str, ...], list[Key]] = defaultdict(list)
        for key in keys:
            groups[key[0]].append(key)
        return groups

    def assemble(self, req: ReadRequest, store: str | None, rows: dict[Key, SourceRow]) -> OnlineFeatures:
        now = self.clock()
        columns = []
        for c in req.columns:
            route = self.route(c.source.name, store)
            limits = [a for a in (c.source.max_age_seconds, req.max_age_seconds) if a is not None]
            max_age = min(limits) if limits else None
            values, statuses, stamps = [], [], []
            for eid in req.ids[c.source.entity]:
                row = rows[(route, c.source.name, eid)]
                stamps.append(row.as_of)
                if row.as_of is None:
                    values.append(None)
                    statuses.append(NOT_FOUND)
                    continue
                if max_age is not None and now - row.as_of > max_age:
                    values.append(None)
                    statuses.append(OUTSIDE_MAX_AGE)
                    continue
                value = row.values.get(c.feature.name)
                if value is None:
                    values.append(None)
                    statuses.append(NULL_VALUE)
                elif value is BAD:
                    values.append(None)
                    statuses.append(INVALID)
                    self.counters["decode_errors"] += 1
                else:
                    values.append(value)
                    statuses.append(STALE_STATUS if row.stale else PRESENT)
            columns.append(FeatureColumn(c.name, values, statuses, stamps))
        return OnlineFeatures(req.join_keys, columns)


def _conf_and_defs(env: str | None, definitions: str | None, overrides: dict | None) -> tuple[RunConf, Definitions]:
    from jobs.config import load_config

    conf = load_config(env, overrides)
    return conf, load_definitions(conf.path(definitions or conf.definitions_dir))


class _Base:
    def _parse(self, features, entities, feature_service, full_feature_names, max_age) -> ReadRequest:
        return parse_request(
            self.defs, entities, features, feature_service=feature_service, full_feature_names=full_feature_names,
            max_entities=self.conf.reader.max_entities, max_age_seconds=max_age,
        )  # fmt: skip

    @property
    def stats(self) -> dict[str, int]:
        """hits, misses, coalesced, early_refreshes, store_reads, entities_read, errors, stale_served, decode_errors."""
        return dict(self._core.counters)

    @property
    def cache(self) -> L1Cache | None:
        return self._core.cache

    def _is_cluster_url(self, rconf) -> bool:
        """redis.mode, or (auto) whether the server says it runs in cluster mode."""
        if self.conf.redis.mode != "auto":
            return self.conf.redis.mode == "cluster"
        from sinks.redis.client import connect
        from sinks.redis.router import is_cluster

        client = connect(rconf, socket_timeout=5.0)
        try:
            return is_cluster(client)
        finally:
            client.close()


class FeatureReader(_Base):
    """Reads features for models, from any number of threads."""

    def __init__(self, conf: RunConf, defs: Definitions, *, cache: bool | None = None, redis_url: str | None = None, clock=time.time):
        self.conf, self.defs = conf, defs
        self._core = _Core(conf, defs, cache=cache, clock=clock)
        self._flights = ThreadFlights()
        timeout = conf.reader.timeout_ms / 1000
        self._stores: dict[str, Any] = {}
        if "redis" in conf.sinks or any("redis" in v for v in conf.reader.stores.values()):
            rconf = conf.redis_sink(url=redis_url)
            self._stores["redis"] = RedisReads(rconf, defs, conf.redis.namespace, cluster=self._is_cluster_url(rconf), timeout=timeout)
        self._stores["cockroach"] = SqlReads(conf.sql_sink(), defs, timeout=timeout, connections=conf.reader.sql_connections)

    @classmethod
    def from_conf(cls, env: str | None = None, *, definitions: str | None = None, overrides: dict | None = None, **kwargs) -> FeatureReader:
        """The reader of a conf environment (``conf/base`` + ``conf/<env>``) and its definitions."""
        conf, defs = _conf_and_defs(env, definitions, overrides)
        return cls(conf, defs, **kwargs)

    def get_online_features(
        self,
        features: list[str] | None = None,
        entities: dict[str, list] | None = None,
        *,
        feature_service: str | None = None,
        full_feature_names: bool = False,
        max_age: float | None = None,
        store: str | None = None,
    ) -> OnlineFeatures:
        """Feast's call: ``features`` as ``source:feature`` (or a source's name), or a
        ``feature_service``; ``entities`` as key columns. Values, statuses and as-of times
        per feature, in entity order."""
        req = self._parse(features, entities or {}, feature_service, full_feature_names, max_age)
        core = self._core
        keys = core.keys(req, store)
        rows, misses, stale, refresh = core.lookup(keys)
        mine, theirs = self._flights.claim(misses)
        early, _ = self._flights.claim(refresh) if refresh else ([], {})
        core.counters["coalesced"] += len(theirs)
        if mine or early:
            self._read_mine(req, mine, early, stale, rows)
        if theirs:
            try:
                rows.update(ThreadFlights.wait(theirs, timeout=max(1.0, self.conf.reader.timeout_ms / 250)))
            except StoreError as exc:
                core.stale_or_raise(list(theirs), stale, exc, rows)
        return core.assemble(req, store, rows)

    def _read_mine(self, req, mine, early, stale, rows) -> None:
        core = self._core
        claimed = [*mine, *early]
        got: dict[Key, SourceRow] = {}
        error: BaseException | None = None
        try:
            start = time.perf_counter()
            for route, keys in core.by_store(claimed).items():
                got.update(self._read_route(route, keys, core.features(req)))
            core.keep(got, time.perf_counter() - start)
        except BaseException as exc:
            error = exc
            if not isinstance(exc, StoreError):
                raise
        finally:  # every claimed key leaves the scoreboard, its waiters told
            self._flights.finish(claimed, got, error)
        if error is not None:
            core.stale_or_raise(mine, stale, error, rows)  # early refreshes keep their fresh answers
        else:
            rows.update({k: got[k] for k in mine})

    def _read_route(self, route: tuple[str, ...], keys: list[Key], features) -> dict[Key, SourceRow]:
        core, out, left = self._core, {}, keys
        for store in route:
            units = [Unit(k[1], k[2]) for k in left]
            core.counters["store_reads"] += 1
            core.counters["entities_read"] += len(units)
            rows = self._stores[store].read(units, {u.source: features[u.source] for u in units}, core.as_list)
            for k, u in zip(left, units):
                out[k] = rows[u]
            left = [k for k in left if out[k].as_of is None]
            if not left:
                break
        return out

    def ping(self) -> dict[str, str]:
        """Each configured store's answer ('ok' or the error), for health checks."""
        out = {}
        for name, store in self._stores.items():
            if name == "cockroach" and "cockroach" not in self.conf.sinks and not any("cockroach" in v for v in self.conf.reader.stores.values()):
                continue
            try:
                store.ping()
                out[name] = "ok"
            except Exception as exc:  # reported, not raised: a health check lists every store
                out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return out

    def close(self) -> None:
        for store in self._stores.values():
            store.close()

    def __enter__(self) -> FeatureReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncFeatureReader(_Base):
    """Reads features for models, on one asyncio event loop."""

    def __init__(self, conf: RunConf, defs: Definitions, *, cache: bool | None = None, redis_url: str | None = None, cluster: bool | None = None, clock=time.time):
        self.conf, self.defs = conf, defs
        self._core = _Core(conf, defs, cache=cache, clock=clock)
        self._flights = AsyncFlights()
        timeout = conf.reader.timeout_ms / 1000
        self._stores: dict[str, Any] = {}
        if "redis" in conf.sinks or any("redis" in v for v in conf.reader.stores.values()):
            rconf = conf.redis_sink(url=redis_url)
            if cluster is None:
                cluster = self._is_cluster_url(rconf)
            self._stores["redis"] = AsyncRedisReads(rconf, defs, conf.redis.namespace, cluster=cluster, timeout=timeout)
        self._stores["cockroach"] = AsyncSqlReads(conf.sql_sink(), defs, timeout=timeout, connections=conf.reader.sql_connections)

    @classmethod
    def from_conf(cls, env: str | None = None, *, definitions: str | None = None, overrides: dict | None = None, **kwargs) -> AsyncFeatureReader:
        conf, defs = _conf_and_defs(env, definitions, overrides)
        return cls(conf, defs, **kwargs)

    async def get_online_features(
        self,
        features: list[str] | None = None,
        entities: dict[str, list] | None = None,
        *,
        feature_service: str | None = None,
        full_feature_names: bool = False,
        max_age: float | None = None,
        store: str | None = None,
    ) -> OnlineFeatures:
        """As FeatureReader.get_online_features, awaited."""
        req = self._parse(features, entities or {}, feature_service, full_feature_names, max_age)
        core = self._core
        keys = core.keys(req, store)
        rows, misses, stale, refresh = core.lookup(keys)
        mine, theirs = self._flights.claim(misses)
        early, _ = self._flights.claim(refresh) if refresh else ([], {})
        core.counters["coalesced"] += len(theirs)
        if mine or early:
            await self._read_mine(req, mine, early, stale, rows)
        if theirs:
            try:
                rows.update(await AsyncFlights.wait(theirs))
            except StoreError as exc:
                core.stale_or_raise(list(theirs), stale, exc, rows)
        return core.assemble(req, store, rows)

    async def _read_mine(self, req, mine, early, stale, rows) -> None:
        core = self._core
        claimed = [*mine, *early]
        got: dict[Key, SourceRow] = {}
        error: BaseException | None = None
        try:
            start = time.perf_counter()
            for route, keys in core.by_store(claimed).items():
                got.update(await self._read_route(route, keys, core.features(req)))
            core.keep(got, time.perf_counter() - start)
        except BaseException as exc:
            error = exc if isinstance(exc, Exception) else StoreError("the read was cancelled by its caller")
            if not isinstance(exc, StoreError):
                raise
        finally:  # also on cancellation: every claimed key leaves the scoreboard, its waiters told
            self._flights.finish(claimed, got, error)
        if error is not None:
            core.stale_or_raise(mine, stale, error, rows)
        else:
            rows.update({k: got[k] for k in mine})

    async def _read_route(self, route, keys, features) -> dict[Key, SourceRow]:
        core, out, left = self._core, {}, keys
        for store in route:
            units = [Unit(k[1], k[2]) for k in left]
            core.counters["store_reads"] += 1
            core.counters["entities_read"] += len(units)
            rows = await self._stores[store].read(units, {u.source: features[u.source] for u in units}, core.as_list)
            for k, u in zip(left, units):
                out[k] = rows[u]
            left = [k for k in left if out[k].as_of is None]
            if not left:
                break
        return out

    async def ping(self) -> dict[str, str]:
        out = {}
        for name, store in self._stores.items():
            if name == "cockroach" and "cockroach" not in self.conf.sinks and not any("cockroach" in v for v in self.conf.reader.stores.values()):
                continue
            try:
                await store.ping()
                out[name] = "ok"
            except Exception as exc:  # reported, not raised
                out[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return out

    async def close(self) -> None:
        for store in self._stores.values():
            await store.close()

    async def __aenter__(self) -> AsyncFeatureReader:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
