"""A push written to the stores the nightly run writes (``sinks``), by the run's own writers.

The writers are the run's (sinks/redis/writer.py, sinks/sql/writer.py), given each row's
event time as its as-of time: the Redis write script and the SQL upsert's ``WHERE`` compare
it with what the store holds, per entity and source, so an older pushed row never replaces
a newer value and a later run never replaces a newer pushed one. They connect with the push
credentials (``server.push.redis`` / ``.sql``, else the run's writer), never the reader's.

Once per source and server: the stores' description of what they hold is checked and
recorded as a run does (sinks/described.py), and the SQL table checked (dialect, columns).
Each push opens its own connections (threads of the server's executor write at once).
"""

from __future__ import annotations

import threading
from dataclasses import replace

import redis

from feature_defs.loader import DefinitionError
from feature_push.errors import PushError
from feature_push.rows import AS_OF, Pushed
from fm_config import RunConf
from serializers.batch import feature_specs
from serializers.horizon import as_of_horizon
from sinks.described import described_writes
from sinks.errors import CapacityError
from sinks.redis.config import RedisSinkConfig, redis_sink_config
from sinks.redis.description import record_description as record_redis
from sinks.redis.preflight import detect_cluster
from sinks.redis.writer import RedisWritePlan
from sinks.sql.config import SqlSinkConfig, sql_sink_config
from sinks.sql.description import record_description as record_sql
from sinks.sql.preflight import preflight as sql_preflight
from sinks.sql.writer import SqlWritePlan
from stores.errors import MaterializerError, TerminalError, TransientError
from stores.sql import connect as sql_connect

STORE_LABELS = {"redis": "Redis", "cockroach": "the SQL store"}


class PushStores:
    """The stores pushes write, with the push credentials (read here, at the server's start:
    a missing password stops the start, not the first push)."""

    def __init__(self, conf: RunConf):
        self.conf = conf
        self.sinks = [s for s in ("redis", "cockroach") if s in conf.sinks]
        self.redis = conf.push_redis_connection() if "redis" in self.sinks else None
        self.sql = conf.push_sql_connection() if "cockroach" in self.sinks else None
        self._cluster: bool | None = None
        self._sql_checked: dict[str, SqlSinkConfig] = {}
        self._described: set[str] = set()
        self._lock = threading.Lock()

    def write(self, pushed: list[Pushed]) -> dict:
        """Write every source's rows (run in a worker thread); per source and store what was
        written and what the store kept because it held newer values."""
        with self._lock:  # once per source: descriptions and the SQL table's check
            for p in pushed:
                self._ready(p)
        sql_rows = [p.sql(self.conf.sql.max_map_bytes) if self.sql else None for p in pushed]  # PushError before any write
        out: dict[str, dict] = {}
        for p, rows in zip(pushed, sql_rows):
            stats = out.setdefault(p.source.name, {})
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
        name = p.source.name
        if name in self._described:
            return
        try:
            redis_config = self._redis_config(p) if self.redis is not None else None
            sql_config = None
            if self.sql is not None:
                base = sql_sink_config(self.conf, p.source, p.entity, connection=self.sql)
                sql_config = self._sql_checked[name] = sql_preflight(self.conf.sql, base, [])
            entries = described_writes(self.conf, p.source, redis_config, sql_config)
            if entries.get("redis"):
                record_redis(redis_config, entries["redis"], cluster=self._cluster)
            if entries.get("cockroach"):
                with sql_connect(sql_config) as conn:
                    record_sql(conn, sql_config.schema, sql_config.table, entries["cockroach"])
        except DefinitionError as exc:
            raise PushError("; ".join(exc.problems), 409, "StoredAsSomethingElse") from None
        except (MaterializerError, redis.RedisError, OSError) as exc:
            raise _store_error(exc, "checking what the stores hold") from exc
        self._described.add(name)

    def _write_redis(self, p: Pushed) -> dict:
        plan = RedisWritePlan(sink=self._redis_config(p), features=feature_specs(p.source.features), as_of_column=AS_OF)
        writer = plan.writer()
        try:
            writer.open()
            writer.write_batch(p.redis)
            writer.flush()
        except (MaterializerError, redis.RedisError) as exc:
            raise _store_error(exc, f"writing {p.source.name} to Redis") from exc
        finally:
            writer.close()
        s = writer.stats
        return {"written": s.entities, "kept_newer": s.skipped_newer, "replaced_future": s.replaced_future}

    def _write_sql(self, p: Pushed, rows) -> dict:
        config = replace(self._sql_checked[p.source.name], horizon=as_of_horizon())
        writer = SqlWritePlan(sink=config, as_of_column=AS_OF).writer()
        try:
            writer.open()
            writer.write_batch(rows)
            writer.flush()
        except MaterializerError as exc:
            raise _store_error(exc, f"writing {p.source.name} to the SQL store") from exc
        finally:
            writer.close()
        s = writer.stats
        return {"written": s.rows_upserted, "kept_newer": s.rows_skipped_newer, "replaced_future": s.rows_replaced_future}


def _store_error(exc: BaseException, doing: str) -> PushError:
    """A store's failure as the push's answer: 507 full, 503 worth a retry, else 502."""
    text = str(exc).strip().split("\n")[0][:300]
    if isinstance(exc, CapacityError):
        return PushError(f"{doing}: {text}", 507, "StoreFull")
    if isinstance(exc, TerminalError):
        return PushError(f"{doing}: {text}", 502, "StoreRefused")
    transient = isinstance(exc, (TransientError, redis.ConnectionError, redis.TimeoutError, OSError))
    return PushError(f"{doing}: {text} (retry: a push repeats safely)", 503 if transient else 502, "StoreUnavailable", transient)
