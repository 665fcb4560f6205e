"""A push written to the stores the nightly run writes (``sinks``), by the run's own writers.

The writers are the run's (sinks/redis/writer.py, sinks/sql/writer.py), given each row's
event time as its as-of time: the Redis write script and the SQL upsert's ``WHERE`` compare
it with what the store holds, per entity and source, so an older pushed row never replaces
a newer value and a later run never replaces a newer pushed one. They connect with the push
credentials (``server.push.redis`` / ``.sql``, else the run's writer), never the reader's.

Before every push: the stores' description of what they hold is read (on kept connections)
and checked as a run checks it (sinks/described.py), and a push on definitions older than
the stores' refused; once per source and server, the SQL table (dialect, columns).

Writers stay open between pushes (:class:`Writers`): opening one costs two connections, the
memory and restart checks and the script's load, 9 ms of CPU a push where the write of one
row costs 1.5 (``make bench-push``). Pushes at once take writers of their own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace

import psycopg
import pyarrow as pa
import redis

from feature_defs.loader import DefinitionError
from feature_defs.stored_lock import Lock
from feature_push.errors import PushError
from feature_push.rows import AS_OF, Pushed
from fm_config import RunConf
from serializers.batch import feature_specs
from serializers.description import Description, parse_redis, redis_key_of
from serializers.horizon import as_of_horizon
from sinks.described import checked_entries, unknown_names
from sinks.errors import CapacityError
from sinks.redis.config import RedisSinkConfig, redis_sink_config
from sinks.redis.description import record_description as record_redis
from sinks.redis.preflight import detect_cluster
from sinks.redis.preflight import preflight as redis_preflight
from sinks.redis.router import KeyRouter
from sinks.sql.config import SqlSinkConfig, sql_sink_config
from sinks.sql.description import read_descriptions
from sinks.sql.description import record_description as record_sql
from sinks.sql.preflight import preflight as sql_preflight
from sinks.sql.writer import SqlWritePlan
from stores.errors import MaterializerError, TerminalError, TransientError
from stores.sql import connect as sql_connect

STORE_LABELS = {"redis": "Redis", "sql": "the SQL store"}


class Writers:
    """Open writers per (source, store), each used by one push at a time. One that failed is
    closed and dropped; one made before the horizon moved (a new day, UTC) is replaced, since
    its idea of a stored as-of time beyond any run's date is the day's (serializers/horizon.py)."""

    def __init__(self):
        self._idle: dict[tuple[str, str], list] = {}
        self._lock = threading.Lock()

    @contextmanager
    def taken(self, key: tuple[str, str], make: Callable[[int], object]) -> Iterator:
        """A writer of ``key``: an idle one of this horizon, else ``make(horizon)``, opened."""
        horizon = as_of_horizon()
        with self._lock:
            idle = self._idle.setdefault(key, [])
            writer = idle.pop() if idle else None
        if writer is not None and writer.plan.sink.horizon != horizon:
            _close(writer)
            writer = None
        if writer is None:
            writer = make(horizon)
            try:
                writer.open()
            except BaseException:
                _close(writer)
                raise
        try:
            yield writer
        except BaseException:
            _close(writer)
            raise
        with self._lock:
            self._idle[key].append(writer)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, {}
        for writers in idle.values():
            for writer in writers:
                _close(writer)


def _close(writer) -> None:
    try:
        writer.close()
    except Exception:  # noqa: BLE001 (a writer given up: its connection may be gone already)
        pass


class EntityLocks:
    """Pushes of one entity and source written one at a time, across both stores: of two
    pushes at the same event time, to the microsecond, each store would otherwise keep
    whichever reached it last, and they could differ. Striped (a fixed number of locks, taken
    in order), so any number of entities costs no memory and two pushes never deadlock."""

    STRIPES = 256

    def __init__(self):
        self._locks = [threading.Lock() for _ in range(self.STRIPES)]

    @contextmanager
    def held(self, source: str, ids: list[str]) -> Iterator[None]:
        stripes = sorted({hash((source, i)) % self.STRIPES for i in ids})
        taken = []
        try:
            for stripe in stripes:
                self._locks[stripe].acquire()
                taken.append(stripe)
            yield
        finally:
            for stripe in reversed(taken):
                self._locks[stripe].release()


class PushStores:
    """The stores pushes write, with the push credentials (read here, at the server's start:
    a missing password stops the start, not the first push)."""

    def __init__(self, conf: RunConf, lock: Lock | None = None):
        self.conf = conf
        self.sinks = [s for s in ("redis", "sql") if s in conf.sinks]
        self.redis = conf.push_redis_connection() if "redis" in self.sinks else None
        self.sql = conf.push_sql_connection() if "sql" in self.sinks else None
        if self.sql is not None:  # a caller waits: a row lock held by a run or another push must not hold it long
            self.sql = replace(self.sql, statement_timeout_ms=min(self.sql.statement_timeout_ms, conf.server.push.store_timeout_ms))
        self._cluster: bool | None = None
        self._sql_checked: dict[str, SqlSinkConfig] = {}
        self._lock = threading.Lock()
        self.writers = Writers()
        self.entities = EntityLocks()
        self.descriptions = KeptDescriptions()
        self.lock = lock
        """The definitions' stored.lock: the names they removed, which a push may retire as a run would."""

    def prepare(self, pushed: list[Pushed]) -> list:
        """What is checked before anything is written, offline too (run in a worker thread):
        the stores' descriptions (every push), the SQL table (once per source), the SQL store's JSON
        objects (PushError: too large, a NUL JSONB cannot hold). Returns what ``write`` takes."""
        with self._lock:
            for p in pushed:
                self._ready(p)
        return [(p, p.sql(self.conf.sql.max_map_bytes) if self.sql else None) for p in pushed]

    def write(self, prepared: list) -> dict:
        """Write every source's rows (run in a worker thread); per source and store what was
        written and what the store kept because it held newer values."""
        out: dict[str, dict] = {}
        for p, rows in prepared:
            stats = out.setdefault(p.source.name, {})
            with self.entities.held(p.source.name, p.ids):  # both stores see this server's pushes of an entity in one order
                if self.redis is not None:
                    stats["redis"] = self._write_redis(p)
                if rows is not None:
                    stats["sql"] = self._write_sql(p, rows)
        return out

    def _redis_config(self, p: Pushed) -> RedisSinkConfig:
        config = redis_sink_config(self.conf, p.source, p.entity, connection=self.redis)
        if self._cluster is None:
            self._cluster = detect_cluster(self.conf.redis, config)
        return replace(config, cluster=self._cluster)

    def _ready(self, p: Pushed) -> None:
        """Before every push, as readers do: what the stores describe, checked against this
        server's definitions; recorded where the push adds to it (a new feature's name)."""
        name = p.source.name
        try:
            redis_config = self._redis_config(p) if self.redis is not None else None
            if self.sql is not None and name not in self._sql_checked:  # the table's columns and dialect: once
                base = sql_sink_config(self.conf, p.source, p.entity, connection=self.sql)
                self._sql_checked[name] = sql_preflight(self.conf.sql, base, [])
            sql_config = self._sql_checked.get(name)
            found = self.descriptions.read(redis_config, sql_config)
            entries = checked_entries(p.source, found)
            unknown = unknown_names(p.source, found, self.lock)
            if unknown:
                raise PushError(_stale(p.source.name, unknown), 409, "StaleDefinitions")
            if entries.get("redis"):
                record_redis(redis_config, entries["redis"], cluster=self._cluster)
            if entries.get("sql"):
                with sql_connect(sql_config) as conn:
                    record_sql(conn, sql_config.schema, sql_config.table, entries["sql"])
        except DefinitionError as exc:
            raise PushError("; ".join(exc.problems), 409, "StoredAsSomethingElse") from None
        except (MaterializerError, redis.RedisError, OSError, psycopg.Error) as exc:
            raise _store_error(exc, "checking what the stores hold") from exc

    def _write_redis(self, p: Pushed) -> dict:
        config, specs = self._redis_config(p), feature_specs(p.source.features)

        def make(horizon: int):
            # the run's own checks first: capacity (a hard ceiling, as redis.hard_fill says), the
            # eviction policy (refused unless redis.eviction allows it), restart and eviction baselines
            checked = redis_preflight(
                self.conf.redis, replace(config, horizon=horizon), p.entity, specs, entities=len(p.ids),
                sample=pa.Table.from_batches([p.redis]), as_of_column=AS_OF, report={}, warnings=[],
            )  # fmt: skip
            return checked.plan.writer()

        s = self._written((p.source.name, "redis"), make, lambda w: w.write_batch(p.redis), f"writing {p.source.name} to Redis")
        return {"written": s["entities"], "kept_newer": s["skipped_newer"], "replaced_future": s["replaced_future"]}

    def _write_sql(self, p: Pushed, rows) -> dict:
        config = self._sql_checked[p.source.name]

        def make(horizon: int):
            # no retries of its own (a caller waits): a push is tried once more on a fresh writer, no more
            return SqlWritePlan(sink=replace(config, horizon=horizon, retries=0), as_of_column=AS_OF).writer()

        s = self._written((p.source.name, "sql"), make, lambda w: w.write_batch(rows), f"writing {p.source.name} to the SQL store")
        return {"written": s["rows_upserted"], "kept_newer": s["rows_skipped_newer"], "replaced_future": s["rows_replaced_future"]}

    def _written(self, key: tuple[str, str], make, write, doing: str) -> dict:
        """Write with a kept writer (the stats this write added). A kept writer whose server
        went away or restarted fails once: a fresh one writes the push again (it repeats safely)."""
        for attempt in (1, 2):
            try:
                with self.writers.taken(key, make) as writer:
                    before = asdict(writer.stats)
                    write(writer)
                    writer.flush()
                    return {k: v - before[k] if isinstance(v, int) else v for k, v in asdict(writer.stats).items()}
            except (MaterializerError, redis.RedisError) as exc:
                if attempt == 2 or isinstance(exc, (TerminalError, redis.ResponseError)):
                    raise _store_error(exc, doing) from exc
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.writers.close()
        self.descriptions.close()


class KeptDescriptions:
    """The stores' descriptions, read before every push on connections kept open (a push
    costs two small reads, not two connections); one that failed is made anew once."""

    def __init__(self):
        self._routers: dict[str, KeyRouter] = {}
        self._sql: psycopg.Connection | None = None
        self._lock = threading.Lock()

    def read(self, redis_config: RedisSinkConfig | None, sql_config: SqlSinkConfig | None) -> dict[str, Description]:
        with self._lock:
            found: dict[str, Description] = {}
            if redis_config is not None:
                found["redis"] = self._again(lambda: self._redis(redis_config))
            if sql_config is not None:
                found["sql"] = self._again(lambda: self._sql_read(sql_config))
            return found

    def _again(self, read):
        try:
            return read()
        except (redis.ConnectionError, redis.exceptions.MovedError, redis.exceptions.AskError, psycopg.OperationalError):
            self.close()  # a kept connection the server dropped, or a slot that moved: made anew, on a fresh map
            return read()

    def _redis(self, config: RedisSinkConfig) -> Description:
        router = self._routers.get(config.key_prefix)
        if router is None:
            router = self._routers[config.key_prefix] = KeyRouter(config, config.cluster)
        key = redis_key_of(config.key_prefix)
        return parse_redis(router.run([key], lambda pipe, k: pipe.hgetall(k))[0])

    def _sql_read(self, config: SqlSinkConfig) -> Description:
        if self._sql is None or self._sql.closed:
            self._sql = sql_connect(config)
        return read_descriptions(self._sql, config.schema, [config.table]).get(config.table, {})

    def close(self) -> None:
        routers, self._routers = self._routers, {}
        for router in routers.values():
            router.close()
        if self._sql is not None:
            self._sql.close()
            self._sql = None


def _stale(source: str, unknown: dict[str, str]) -> str:
    names = ", ".join(f"{n!r} ({where})" for n, where in unknown.items())
    return (
        f"source {source!r}: the stores hold {names}, which this server's definitions do not write: newer definitions "
        "wrote them, and a push on these would date their values anew. Deploy the definitions the nightly run uses to "
        "this server and restart it; if they were removed on purpose, record that with `materialize defs --lock`"
    )


def _store_error(exc: BaseException, doing: str) -> PushError:
    """A store's failure as the push's answer: 507 full, 503 worth a retry, else 502."""
    text = str(exc).strip().split("\n")[0][:300]
    if isinstance(exc, CapacityError):
        return PushError(f"{doing}: {text}", 507, "StoreFull")
    if isinstance(exc, TerminalError):
        return PushError(f"{doing}: {text}", 502, "StoreRefused")
    transient = isinstance(exc, (TransientError, redis.ConnectionError, redis.TimeoutError, OSError, psycopg.OperationalError))
    return PushError(f"{doing}: {text} (retry: a push repeats safely)", 503 if transient else 502, "StoreUnavailable", transient)
