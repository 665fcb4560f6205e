"""What every stage of one run knows: frozen, built once by the orchestration (run.py)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace

from pyspark.sql import SparkSession

from feature_defs import EntityDef, SourceDef
from fm_config import RunConf
from jobs.event_time import EventWindow
from serializers.keys import as_of_epoch
from sinks.redis.config import RedisSinkConfig, redis_sink_config
from sinks.sql.config import SqlSinkConfig, sql_sink_config


@dataclass(frozen=True)
class RunContext:
    spark: SparkSession | None
    """None only for stages that need no Spark (the SQL store's checks)."""
    conf: RunConf
    source: SourceDef
    entity: EntityDef
    date: dt.date
    end: dt.date | None = None
    """A range run (backfill, latest mode): the dates date..end in one pass."""
    redis_url: str | None = None
    """Overrides redis.url (the CLI's --redis-url)."""
    shared_entity: bool = True
    """Other sources write this entity type too: a SQL write moves the expiry of their rows (sinks/sql/statements.follow_expiry)."""
    window: EventWindow | None = None
    """select_by event_time: the event times the run covers (jobs/event_time.py); None: a date's partition."""

    def redis_config(self) -> RedisSinkConfig:
        """The Redis writer's config for this source and date (before the preflight)."""
        return redis_sink_config(self.conf, self.source, self.entity, self.date, url=self.redis_url)

    def sql_config(self) -> SqlSinkConfig:
        """The SQL writer's config for this source and date (before the preflight)."""
        return replace(sql_sink_config(self.conf, self.source, self.entity, self.date), follow_expiry=self.shared_entity)

    @contextmanager
    def stage(self, summary, name: str, *, timed: bool = True) -> Iterator[None]:
        """Time a stage in the summary (unless not ``timed``: the caller adds its seconds), and
        tag the Spark jobs it runs with the local property ``fm.stage`` (the Spark UI and event
        log then say which stage ran each job)."""
        sc = self.spark.sparkContext if self.spark is not None else None
        previous = sc.getLocalProperty("fm.stage") if sc else None
        if sc:
            sc.setLocalProperty("fm.stage", name)
        try:
            with summary.stage(name) if timed else nullcontext():
                yield
        finally:
            if sc:
                sc.setLocalProperty("fm.stage", previous)

    @property
    def per_date(self) -> bool:
        return self.end is not None

    @property
    def as_of(self) -> int:
        """The snapshot's as-of time: the end of its (last) date, UTC epoch seconds; by event
        time, the window's end (each entity is stored as of its row's event time)."""
        if self.window is not None:
            return int(self.window.end.timestamp())
        return as_of_epoch(self.end or self.date)
