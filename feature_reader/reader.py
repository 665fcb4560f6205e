"""FeatureReader (threads) and AsyncFeatureReader (asyncio): L1 cache -> Redis -> SQL.

A request names features and entities in Feast's shape (feature_reader/request.py). Each
(source, entity) it needs is looked up in the L1 cache; the misses are claimed on the
single-flight scoreboard (a key another caller is reading is waited for, not read again),
read from the source's stores in one batch per store (Redis first; for a source in both
stores, what Redis does not hold is read from SQL), put in the cache, and the columns are
assembled with Feast's statuses. A Redis failure of sources the SQL store holds too is
read from SQL (reader.fallback); each store has a circuit breaker (breaker.py); a store
failure otherwise serves expired entries within the stale-if-error window, and fails the
call without them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from feature_defs import Definitions, FeatureDef, load_definitions
from feature_reader.breaker import Breaker
from feature_reader.cache import FRESH, REFRESH, STALE, L1Cache
from feature_reader.decode import BAD
from feature_reader.descriptions import REFUSED, Verdicts, fetch_error, fetch_redis, fetch_sql
from feature_reader.descriptions import now as monotonic
from feature_reader.errors import ReadTimeout, RequestError, StoreError, StoreUnavailable
from feature_reader.redis_reads import AsyncRedisReads, RedisReads
from feature_reader.request import ReadRequest, SelectionMemo, parse_request
from feature_reader.response import INVALID, NOT_FOUND, NULL_VALUE, OUTSIDE_MAX_AGE, PRESENT, OnlineFeatures
from feature_reader.response import STALE as STALE_STATUS
from feature_reader.rows import UNUSABLE_AS_OF, SourceRow, Unit
from feature_reader.singleflight import AsyncFlights, NoFlights, ThreadFlights
from feature_reader.sql_reads import AsyncSqlReads, SqlReads
from fm_config import RunConf, load_config
from serializers.horizon import as_of_horizon
from stores.redis import connect, is_cluster, known_nodes
from stores.redis import server_address as redis_server_address

STORES = {"redis": "redis", "sql": "sql", "cockroach": "sql"}  # cockroach: the SQL store's old name (fm_config/stores.py)
"""--store names (and the conf's sink names) -> sink name."""

COUNTERS = (
    "hits", "misses", "coalesced", "early_refreshes", "store_reads", "entities_read", "errors", "stale_served", "decode_errors",
    "fallbacks", "breaker_opens", "breaker_skips", "bad_freshness", "refused_cells",
)  # fmt: skip

Key = tuple  # (route, source, entity_id, fields): what the cache and the scoreboard are keyed by


class Step(NamedTuple):
    """What a read (:meth:`_Core.get`) yields for its reader to do, then sends it the outcome of.

    ``kind`` "read": read ``units``'s ``features`` from ``store``; the outcome is the rows read.
    ``kind`` "wait": wait on ``futures``, other callers' reads of the same keys; the outcome is
    their rows. The kind is first, so ``step[0]`` tells them apart too."""

    kind: Literal["read", "wait"]
    store: str | None = None
    units: list[Unit] | None = None
    features: dict[str, list[FeatureDef]] | None = None
    futures: dict | None = None


PUSHED_KEPT = 100_000
"""Entities whose last push a reader remembers for its scoreboard (then all forgotten at once, safely)."""


def _claim(flights, keys: list, flight: dict | None) -> tuple[list, dict]:
    """flights.claim of ``keys``, through their scoreboard keys when there are (``flight``)."""
    if flight is None:
        return flights.claim(keys)
    back = {flight[k]: k for k in keys}
    mine, theirs = flights.claim(list(back))
    return [back[f] for f in mine], {back[f]: fut for f, fut in theirs.items()}


class _Core:
    """What both readers share: routing, the cache, the scoreboard's use, counting, the
    columns. A read is one generator (:meth:`get`) that yields what it needs done, a store
    read or a wait on others' reads, and is sent the outcome: the threaded reader does
    each step in its thread, the asyncio reader awaits it."""

    def __init__(self, conf: RunConf, defs: Definitions, *, cache: bool | None, clock=time.time):
        self.conf, self.defs, self.settings = conf, defs, conf.reader
        enabled = self.settings.cache.enabled if cache is None else cache
        self.cache = L1Cache(self.settings.cache) if enabled else None
        self.clock = clock
        self.counters: Counter = Counter()
        self._counting = threading.Lock()  # the threaded reader's callers count at once
        self.as_list = self.settings.embeddings == "list"
        self._routes: dict[tuple, tuple[str, ...]] = {}  # (source, store asked) -> the stores read, in order
        self.verdicts = Verdicts(defs)  # what each store says it holds: features never decoded there
        self.pushes = 0  # pushes taken: a read under way when one lands keeps nothing in the cache
        self._pushed_at: dict[tuple[str, str], int] = {}  # (source, entity) -> the push that last wrote it
        self._epoch = 0  # moves when _pushed_at is emptied (bounded), so no read begun before is joined

    def route(self, source: str, store: str | None) -> tuple[str, ...]:
        got = self._routes.get((source, store))
        if got is None:
            got = self._routes[(source, store)] = self._route(source, store)
        return got

    def _route(self, source: str, store: str | None) -> tuple[str, ...]:
        if store is not None:
            if store not in STORES:
                raise RequestError(f"unknown store {store!r}; use redis or sql")
            return (STORES[store],)
        ordered = tuple(s for s in ("redis", "sql") if s in self.stores_of(source))
        return ordered if self.settings.read_through else ordered[:1]

    def stores_of(self, source: str) -> list[str]:
        return self.settings.stores.get(source) or self.conf.sinks

    def uses(self, store: str) -> bool:
        """Whether any source is served by ``store``."""
        return store in self.conf.sinks or any(store in v for v in self.settings.stores.values())

    def features(self, req: ReadRequest) -> dict[str, list[FeatureDef]]:
        """Per source, the features a store read fetches: all of them when the cache keeps
        the entry (it answers later requests for others), else only those asked for."""
        if self.cache is not None:
            return {name: s.features for name, s in req.sources.items()}
        return req.asked

    def keys(self, req: ReadRequest, store: str | None) -> dict[tuple[str, str], Key]:
        """(source, entity id) -> its key: the route, the source, the entity, and which
        features a read of it fetches (a read of other features is another read)."""
        out: dict[tuple[str, str], Key] = {}
        for name, source in req.sources.items():
            route = self.route(name, store)
            fields = "*" if self.cache is not None else req.fields[name]
            for eid in req.ids[source.entity]:
                out[(name, eid)] = (route, name, eid, fields)
        return out

    def _flight_keys(self, keys) -> dict | None:
        """The scoreboard's key of each key once pushes were taken: it holds the push that last
        wrote the entity, so a read asked after a push never waits on one begun before it."""
        if not self.pushes:
            return None
        pushed, epoch = self._pushed_at, self._epoch
        return {k: (k, epoch, pushed.get((k[1], k[2]), 0)) for k in keys}

    def forget(self, source: str, ids) -> int:
        """A push wrote ``source`` for these entities: their cache entries leave (every route
        they were read by), reads under way keep nothing, and reads asked from now on read the
        store rather than wait on those. Returns the entries dropped."""
        self.pushes += 1
        if len(self._pushed_at) > PUSHED_KEPT:
            self._pushed_at.clear()
            self._epoch += 1
        for eid in ids:
            self._pushed_at[(source, eid)] = self.pushes
        if self.cache is None:
            return 0
        routes = {route for (name, _), route in list(self._routes.items()) if name == source}
        return self.cache.drop([(route, source, eid, "*") for route in routes for eid in ids])

    def count(self, **amounts: int) -> None:
        with self._counting:
            for name, amount in amounts.items():
                if amount:
                    self.counters[name] += amount

    def lookup(self, keys) -> tuple[dict[Key, SourceRow], list[Key], dict[Key, SourceRow], list[Key]]:
        """(answers, misses, stale entries of the misses, keys to refresh early)."""
        if self.cache is None:
            self.count(misses=len(keys))
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
        self.count(hits=len(answers), misses=len(misses))
        return answers, misses, stale, refresh

    def get(self, req: ReadRequest, store: str | None, flights):
        """The read of a request, as a generator: yields each :class:`Step` (a store read, a
        wait on others' reads) and is sent its outcome; returns the columns."""
        features = self.features(req)
        keys = self.keys(req, store)
        rows, misses, stale, refresh = self.lookup(keys.values())
        flight = self._flight_keys([*misses, *refresh])
        mine, theirs = _claim(flights, misses, flight) if misses else ([], {})
        early = _claim(flights, refresh, flight)[0] if refresh else []  # one caller refreshes; the others keep their fresh answers
        if theirs or early:
            self.count(coalesced=len(theirs), early_refreshes=len(early))
        claimed = [*mine, *early]
        if claimed:
            got: dict[Key, SourceRow] = {}
            error: BaseException | None = None
            try:
                start, generation, pushes = time.perf_counter(), self.verdicts.generation, self.pushes
                got = yield from self._read(claimed, features, store)
                # else masked under verdicts since replaced, or read before a push landed: not kept
                if self.verdicts.generation == generation and self.pushes == pushes:
                    self._keep(got, time.perf_counter() - start)
            except BaseException as exc:  # a cancelled caller (GeneratorExit, CancelledError) too
                error = exc if isinstance(exc, Exception) else StoreError("the read was cancelled by its caller")
                if not isinstance(exc, StoreError):
                    raise
            finally:  # every claimed key leaves the scoreboard, its waiters told
                if flight is None:
                    flights.finish(claimed, got, error)
                else:
                    flights.finish([flight[k] for k in claimed], {flight[k]: v for k, v in got.items()}, error)
            if error is not None:
                self._stale_or_raise(mine, stale, error, rows)
            else:
                rows.update({k: got[k] for k in mine})
        if theirs:
            try:
                if flight is None:
                    rows.update((yield Step("wait", futures=theirs)))
                else:
                    back = {flight[k]: k for k in theirs}
                    waited = yield Step("wait", futures={flight[k]: f for k, f in theirs.items()})
                    rows.update({back[f]: v for f, v in waited.items()})
            except StoreError as exc:
                self._stale_or_raise(list(theirs), stale, exc, rows)
        return self._assemble(req, keys, rows)

    def _read(self, keys: Sequence[Key], features, asked: str | None):
        """Each key from its route's stores in turn: a store's misses go to the next one. A
        store that fails hands all its keys to the next one (the SQL store after Redis) when
        ``reader.fallback`` is on, no store was asked for, and every key's source is held there."""
        got: dict[Key, SourceRow] = {}
        by_route: dict[tuple[str, ...], list[Key]] = defaultdict(list)
        for key in keys:
            by_route[key[0]].append(key)
        for route, left in by_route.items():
            stores, at = list(route), 0
            while at < len(stores):
                store = stores[at]
                units = [Unit(k[1], k[2]) for k in left]
                self.count(store_reads=1, entities_read=len(units))
                try:
                    rows = yield Step("read", store, units, features)
                except StoreError as exc:
                    if isinstance(exc, StoreUnavailable):  # skipped by the breaker: the store was not asked
                        self.count(store_reads=-1, entities_read=-len(units))
                    if asked is not None or not self.settings.fallback:
                        raise
                    spare = stores[at + 1] if at + 1 < len(stores) else self._spare(left, store)
                    if spare is None:
                        raise
                    if at + 1 == len(stores):
                        stores.append(spare)
                    self.count(fallbacks=1)
                    at += 1
                    continue
                rows = self.verdicts.mask(store, rows)
                for k, u in zip(left, units):
                    got[k] = rows[u]
                left = [k for k in left if got[k].as_of is None]
                if not left:
                    break
                at += 1
        return got

    def _spare(self, keys: Sequence[Key], failed: str) -> str | None:
        """The store that takes over a failed store's keys: the next one every key's source is held by, if any."""
        spares = set()
        for source in {k[1] for k in keys}:
            held = [s for s in ("redis", "sql") if s in self.stores_of(source)]
            after = held[held.index(failed) + 1 :] if failed in held else []
            spares.add(after[0] if after else None)
        return spares.pop() if len(spares) == 1 else None

    def _keep(self, rows: dict[Key, SourceRow], seconds: float) -> None:
        if self.cache is None:
            return
        for key, row in rows.items():
            self.cache.put(key, row, size=row.size, negative=row.as_of is None, delta=seconds)

    def _stale_or_raise(self, keys: Sequence[Key], stale: dict[Key, SourceRow], error: BaseException, out: dict) -> None:
        """Expired entries answer for ``keys`` when the store failed; any key without one fails the call."""
        self.count(errors=1)
        if any(k not in stale for k in keys):
            raise error
        for k in keys:
            out[k] = stale[k]._replace(stale=True)
        self.count(stale_served=len(keys))

    def _assemble(self, req: ReadRequest, keys: dict[tuple[str, str], Key], rows: dict[Key, SourceRow]) -> OnlineFeatures:
        now = self.clock()
        horizon = as_of_horizon(now, self.settings.clock_skew_seconds)
        width = len(req.columns)
        values: list = [None] * width
        statuses: list = [None] * width
        stamps: list = [None] * width
        pending: list = []  # every row PRESENT in every feature, one layout: columns are the rows transposed, when asked for
        for name, (positions, feats) in req.groups.items():
            source = req.sources[name]
            limits = [a for a in (source.max_age_seconds, req.max_age_seconds) if a is not None]
            max_age = min(limits) if limits else None
            rs = [rows[keys[(name, eid)]] for eid in req.ids[source.entity]]
            as_of = [r.as_of for r in rs]
            withheld = [NOT_FOUND if t is None else OUTSIDE_MAX_AGE if max_age is not None and now - t > max_age else None for t in as_of]
            # an unusable freshness value, or one beyond the horizon (later than any date a run
            # accepts: corrupt, serializers/horizon.py): the source's cells of that entity are INVALID, no time shown
            if UNUSABLE_AS_OF in as_of or max(filter(None, as_of), default=0) > horizon:
                withheld = [INVALID if t is not None and (t == UNUSABLE_AS_OF or t > horizon) else w for t, w in zip(as_of, withheld)]
                as_of = [None if w == INVALID else t for t, w in zip(as_of, withheld)]
                self.count(bad_freshness=withheld.count(INVALID))
            layout = rs[0].names
            if all(r.complete and not r.stale and r.names is layout for r in rs) and not any(withheld):
                if feats == layout.order and positions[-1] - positions[0] == len(positions) - 1:  # the whole read, in order
                    pending.append((positions, None, [r.values for r in rs], as_of))
                    continue
                if all(f in layout for f in feats):
                    pending.append((positions, [layout[f] for f in feats], [r.values for r in rs], as_of))
                    continue
            for at, f in zip(positions, feats):
                values[at], statuses[at] = self._column(f, rs, withheld)
                stamps[at] = as_of
        return OnlineFeatures(req.join_keys, list(req.names), values, statuses, stamps, pending)

    def _column(self, feature: str, rs: list[SourceRow], withheld: list) -> tuple[list, list]:
        """A column cell by cell: NOT_FOUND, OUTSIDE_MAX_AGE, NULL_VALUE, INVALID or STALE among its values."""
        values, statuses = [], []
        for row, status in zip(rs, withheld):
            value = None if status else row.get(feature)
            if status:
                statuses.append(status)
            elif value is None:
                statuses.append(NULL_VALUE)
            elif value is BAD:
                value = None
                statuses.append(INVALID)
                self.count(decode_errors=1)
            elif value is REFUSED:  # the store holds this stored name as something else (feature_reader/descriptions.py)
                value = None
                statuses.append(INVALID)
                self.count(refused_cells=1)
            else:
                statuses.append(STALE_STATUS if row.stale else PRESENT)
            values.append(value)
        return values, statuses


class _Base:
    """What both readers' front ends share: the request, the stores, their breakers, stats.

    No store is asked anything at start: a reader (and ``materialize serve``) starts while a
    store is down. With ``redis.mode: auto`` the first successful contact decides between
    one server and a cluster (a cluster client also needs its nodes to be made); until then
    Redis's reads fail as a store failure (the fallback and stale values answer instead)."""

    def __init__(self, conf: RunConf, defs: Definitions, cache: bool | None, clock, redis_url: str | None, cluster: bool | None, kinds):
        self.conf, self.defs = conf, defs
        self._core = _Core(conf, defs, cache=cache, clock=clock)
        self._selections = SelectionMemo(max_bytes=conf.reader.max_memo_bytes)
        self._kinds = kinds
        settings = conf.reader
        self._timeouts = dict(timeout=settings.timeout_ms / 1000, connect_timeout=settings.connect_timeout_ms / 1000)
        self._stores: dict[str, Any] = {}  # None: Redis, not made yet (see _made)
        self._where: dict[str, str] = {}
        self._making = threading.Lock()
        if self._core.uses("redis"):
            self._rconf, self._cluster = conf.reader_redis_connection(redis_url), cluster
            self._stores["redis"] = None
            self._where["redis"] = f"Redis at {redis_server_address(self._rconf.url)}"
            if cluster is False or (cluster is None and conf.redis.mode == "standalone"):
                self._make_redis()  # asks nothing of the server (a cluster's client does: made on first use)
        if self._core.uses("sql"):
            sql_reads = kinds[1]
            sconf = conf.reader_sql_connection()
            self._stores["sql"] = sql_reads(sconf, defs, connections=settings.sql_connections, **self._timeouts)
            self._where["sql"] = f"SQL store at {self._stores['sql'].where}"
        cooldown = settings.breaker_cooldown_ms / 1000
        self.breakers = {name: Breaker(self._where[name], settings.breaker_failures, cooldown) for name in self._stores}
        self.failed_calls = 0  # store calls that failed, ever (a cached health answer older than the last one is stale)
        self._describing = {name: threading.Lock() for name in self._stores}

    def _fetch_description(self, name: str) -> dict:
        """What store ``name`` says it holds (blocking: the asyncio reader calls it in a thread)."""
        settings = self.conf.reader
        wait = max(settings.timeout_ms, settings.connect_timeout_ms) / 1000
        try:
            if name == "redis":
                store = self._stores["redis"] or self._make_redis()
                seeds = known_nodes(store.client) if store.cluster else ()  # the URL's node may be the one that failed
                return fetch_redis(self.defs, self._rconf, self.conf.redis.namespace, store.cluster, wait, seeds)
            return fetch_sql(self.defs, self._stores["sql"].config)
        except StoreError:
            raise
        except Exception as exc:  # the store not reached, or refused the query: a store failure
            raise fetch_error(self._where[name], exc) from exc

    def _take_description(self, name: str, found: dict) -> None:
        if self._core.verdicts.update(name, found, monotonic()) and self._core.cache is not None:
            self._core.cache.clear()  # entries decoded under the verdicts before

    def _description_failed(self, name: str) -> None:
        """A refresh that failed keeps the verdicts it had until the next one is due."""
        self._core.verdicts.read_at[name] = monotonic()

    def _description_due(self, name: str) -> bool:
        return self._core.verdicts.due(name, self.conf.reader.description_refresh_seconds, monotonic())

    def _description_stale(self, name: str) -> bool:
        """No description read yet, or the last one twice the interval old (no read refreshed
        it, or the refreshes failed): not read by; a read waits for a new one, or fails as a
        store failure (the fallback and stale values answer)."""
        return self._core.verdicts.stale(name, 2 * self.conf.reader.description_refresh_seconds, monotonic())

    @property
    def refused_features(self) -> int:
        return self._core.verdicts.refused_features()

    @property
    def descriptions(self) -> dict:
        """Per store read so far: the features refused there (why) and the undescribed entity types."""
        return self._core.verdicts.report()

    def _make_redis(self):
        """Redis's reads, made once its mode is known (may ask the server: call off the event loop)."""
        with self._making:
            made = self._stores["redis"]
            if made is not None:
                return made
            redis_reads = self._kinds[0]
            cluster = self._is_cluster(self._rconf) if self._cluster is None else self._cluster
            extra = {"connections": self.conf.reader.redis_connections} if redis_reads is AsyncRedisReads else {}
            made = redis_reads(self._rconf, self.defs, self.conf.redis.namespace, cluster=cluster, **self._timeouts, **extra)
            self._stores["redis"] = made
            return made

    def _made_or_error(self):
        try:
            return self._make_redis()
        except StoreError:
            raise
        except Exception as exc:  # the server not reached: a store failure, its address named, no credentials
            raise StoreError(f"{self._where['redis']}: not reached yet ({_failure(exc)})") from exc

    def _allowed(self, name: str) -> Breaker:
        breaker = self.breakers[name]
        try:
            breaker.allow()
        except StoreUnavailable:
            self._core.count(breaker_skips=1)
            raise
        return breaker

    def _failed(self, name: str, exc: BaseException) -> None:
        self.failed_calls += 1
        if self.breakers[name].failed_call(exc):
            self._core.count(breaker_opens=1)

    @classmethod
    def from_conf(cls, env: str | None = None, *, definitions: str | None = None, overrides: dict | None = None, **kwargs):
        """The reader of a conf environment (``conf/base`` + ``conf/<env>``) and its definitions."""
        conf = load_config(env, overrides)
        return cls(conf, load_definitions(conf.path(definitions or conf.definitions_dir)), **kwargs)

    def _request(self, features, entities, feature_service, full_feature_names, max_age) -> ReadRequest:
        return parse_request(
            self.defs, entities or {}, features, feature_service=feature_service, full_feature_names=full_feature_names,
            max_entities=self.conf.reader.max_entities, max_age_seconds=max_age, memo=self._selections,
            max_features=self.conf.reader.max_features, max_key_bytes=self.conf.reader.max_key_bytes,
        )  # fmt: skip

    def _configured(self, name: str) -> None:
        if name not in self._stores:
            raise RequestError(f"no {'Redis' if name == 'redis' else 'SQL store'} is configured for reads (sinks, reader.stores)")

    @property
    def breaker_states(self) -> dict[str, int]:
        """Per store: 0 closed (calls go through), 1 open (calls skipped), 2 half-open (one probe)."""
        return {name: b.state for name, b in self.breakers.items()}

    @property
    def stats(self) -> dict[str, int]:
        """hits, misses, coalesced, early_refreshes, store_reads, entities_read, errors, stale_served, decode_errors,
        fallbacks (store reads handed to the other store), breaker_opens, breaker_skips (store calls not made: breaker open),
        bad_freshness ((source, entity) pairs answered INVALID for an unusable freshness value, or one beyond the horizon),
        refused_cells (cells answered INVALID: the store holds the feature's stored name as something else)."""
        with self._core._counting:
            return {name: self._core.counters.get(name, 0) for name in COUNTERS}

    @property
    def cache(self) -> L1Cache | None:
        return self._core.cache

    def forget(self, source: str, ids) -> int:
        """Entities a push just wrote: this reader answers their new values at once."""
        return self._core.forget(source, ids)

    def _is_cluster(self, rconf) -> bool:
        """redis.mode, or (auto) whether the server says it runs in cluster mode."""
        if self.conf.redis.mode != "auto":
            return self.conf.redis.mode == "cluster"
        wait = self.conf.reader.connect_timeout_ms / 1000
        client = connect(rconf, socket_timeout=wait, connect_timeout=wait)
        try:
            return is_cluster(client)
        finally:
            client.close()


async def _yes(within: float) -> bool:
    return True


def _failure(exc: Exception) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


class FeatureReader(_Base):
    """Reads features for models, from any number of threads."""

    def __init__(
        self,
        conf: RunConf,
        defs: Definitions,
        *,
        cache: bool | None = None,
        redis_url: str | None = None,
        cluster: bool | None = None,
        clock=time.time,
    ):
        super().__init__(conf, defs, cache, clock, redis_url, cluster, (RedisReads, SqlReads))
        self._flights = ThreadFlights() if conf.reader.single_flight else NoFlights()
        # connections opened ahead of the first read, off the caller's thread
        self._warming = threading.Thread(target=self._warm, name="feature-reader-warm", daemon=True)
        self._warming.start()

    def _warm(self) -> None:
        for name in list(self._stores):
            try:
                (self._stores[name] or self._make_redis()).warm()
            except Exception:  # not reached: the first read or health check reports it
                pass

    def _described(self, name: str) -> None:
        """The store's description, read when due: one caller reads it, the others go on with
        the one they have (they wait only for the first)."""
        stale = self._description_stale(name)
        if not stale and not self._description_due(name):
            return
        lock = self._describing[name]
        if not lock.acquire(blocking=stale):
            return
        try:
            stale = self._description_stale(name)
            if not stale and not self._description_due(name):  # another thread read it meanwhile
                return
            try:
                found = self._fetch_description(name)
            except StoreError:
                if stale:
                    raise
                self._description_failed(name)
                return
            self._take_description(name, found)
        finally:
            lock.release()

    def _read_store(self, name: str, units, features):
        """One store call, through its breaker: skipped at once while the breaker is open."""
        self._configured(name)
        breaker = self._allowed(name)
        try:
            self._described(name)
            out = (self._stores[name] or self._made_or_error()).read(units, features, self._core.as_list)
        except BaseException as exc:
            self._failed(name, exc)
            raise
        breaker.succeeded()
        return out

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
        steps = self._core.get(self._request(features, entities, feature_service, full_feature_names, max_age), store, self._flights)
        wait = max(5.0, 4 * self.conf.reader.timeout_ms / 1000)  # another thread's read: its stores' deadlines and a connect
        try:
            step = next(steps)
            while True:
                try:
                    if step.kind == "read":
                        outcome = self._read_store(step.store, step.units, step.features)
                    else:
                        outcome = ThreadFlights.wait(step.futures, timeout=wait)
                except concurrent.futures.TimeoutError:
                    step = steps.throw(ReadTimeout(f"another caller's read of these entities took over {wait:.1f} s"))
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(outcome)
        except StopIteration as done:
            return done.value
        finally:
            steps.close()

    def describe(self) -> dict:
        """Each store's description read when due (a store that fails is left out), then
        :attr:`descriptions` (the reads do this themselves; call it to know before them)."""
        for name in list(self._stores):
            try:
                self._described(name)
            except Exception:  # noqa: BLE001 (the store's ping and reads report it)
                pass
        return self.descriptions

    def ping(self) -> dict[str, str]:
        """Each configured store's answer ('ok' or the error), for health checks: asked on the
        reader's own connections (past the breakers; an answer closes a store's breaker)."""
        out = {}
        for name in self._stores:
            try:
                (self._stores[name] or self._made_or_error()).ping()
                self.breakers[name].succeeded()
                out[name] = "ok"
            except Exception as exc:  # reported, not raised: a health check lists every store
                out[name] = _failure(exc)
        return out

    def close(self) -> None:
        self._warming.join()  # bounded by reader.connect_timeout_ms
        for store in self._stores.values():
            if store is not None:
                store.close()

    def __enter__(self) -> FeatureReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncFeatureReader(_Base):
    """Reads features for models, on one asyncio event loop."""

    def __init__(
        self,
        conf: RunConf,
        defs: Definitions,
        *,
        cache: bool | None = None,
        redis_url: str | None = None,
        cluster: bool | None = None,
        clock=time.time,
    ):
        super().__init__(conf, defs, cache, clock, redis_url, cluster, (AsyncRedisReads, AsyncSqlReads))
        self._flights = AsyncFlights() if conf.reader.single_flight else NoFlights()
        self._warming: list[asyncio.Task] = []
        self._making_task: asyncio.Future | None = None
        self._describing_tasks: dict[str, asyncio.Future] = {}

    async def _described(self, name: str) -> None:
        """The store's description, read in a thread when due, one read at a time; only the
        first is waited for (later ones refresh in the background)."""
        stale = self._description_stale(name)
        if not stale and not self._description_due(name):
            return
        task = self._describing_tasks.get(name)
        if task is None or task.done():
            task = self._describing_tasks[name] = asyncio.ensure_future(self._describe(name))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        if stale:
            await asyncio.shield(task)  # none yet, or too old to read by (an idle reader): the read waits for it

    async def _describe(self, name: str) -> None:
        stale = self._description_stale(name)
        try:
            found = await asyncio.to_thread(self._fetch_description, name)
        except StoreError:
            if stale:
                raise
            self._description_failed(name)
            return
        self._take_description(name, found)

    def warm(self) -> None:
        """Open the stores' connections in the background (on the reader's event loop; the
        server calls it at start-up, ``async with`` does too); failures are left to the reads."""
        if not self._warming:
            loop = asyncio.get_running_loop()
            self._warming = [loop.create_task(self._warm(name)) for name in self._stores]

    async def _warm(self, name: str) -> None:
        try:
            store = self._stores[name] or await asyncio.to_thread(self._make_redis)
            got = store.warm()
            if asyncio.iscoroutine(got):
                await got
            await self._described(name)  # what the store holds, known before the first read
        except Exception:  # not reached: the first read or health check reports it
            pass

    async def _store_now(self, name: str):
        made = self._stores[name]
        if made is not None:
            return made
        # one attempt at a time, shared: a burst of requests while Redis is down must not queue
        # one thread each (each may wait the connect timeout) in the default executor
        if self._making_task is None or self._making_task.done():
            self._making_task = asyncio.ensure_future(asyncio.to_thread(self._made_or_error))
            self._making_task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no warning when all waiters left
        return await asyncio.shield(self._making_task)

    async def _read_store(self, name: str, units, features):
        """One store call, through its breaker: skipped at once while the breaker is open."""
        self._configured(name)
        breaker = self._allowed(name)
        try:
            store = await self._store_now(name)
            await self._described(name)
            if breaker.failed and not await getattr(store, "connected", _yes)(self._timeouts["timeout"]):
                # a store that just failed, without a connection: the read waits for the connect
                # no longer than its deadline (a paused server makes a connect hang), then goes to the fallback
                raise StoreUnavailable(f"{self._where[name]}: no connection since its last failure (reconnecting in the background)")
            out = await store.read(units, features, self._core.as_list)
        except BaseException as exc:  # a call cancelled at the request's deadline too
            self._failed(name, exc)
            raise
        breaker.succeeded()
        return out

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
        steps = self._core.get(self._request(features, entities, feature_service, full_feature_names, max_age), store, self._flights)
        try:
            step = next(steps)
            while True:
                try:
                    if step.kind == "read":
                        outcome = await self._read_store(step.store, step.units, step.features)
                    else:
                        outcome = await AsyncFlights.wait(step.futures)
                except Exception as exc:
                    step = steps.throw(exc)
                else:
                    step = steps.send(outcome)
        except StopIteration as done:
            return done.value
        finally:  # a cancelled caller: closing the steps takes its keys off the scoreboard
            steps.close()

    async def describe(self) -> dict:
        """Each store's description read when due (a store that fails is left out), then
        :attr:`descriptions`: for the health answer."""
        for name in list(self._stores):
            try:
                await self._described(name)
            except Exception:  # noqa: BLE001 (the store's ping reports it)
                pass
        return self.descriptions

    async def ping(self) -> dict[str, str]:
        """As FeatureReader.ping, the stores asked at once."""

        async def one(name: str) -> str:
            try:
                await (await self._store_now(name)).ping()
            except Exception as exc:  # reported, not raised
                return _failure(exc)
            self.breakers[name].succeeded()
            return "ok"

        names = list(self._stores)
        return dict(zip(names, await asyncio.gather(*(one(n) for n in names))))

    async def close(self) -> None:
        for task in self._warming:
            task.cancel()
        await asyncio.gather(*self._warming, return_exceptions=True)
        for store in self._stores.values():
            if store is not None:
                await store.close()

    async def __aenter__(self) -> AsyncFeatureReader:
        self.warm()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
