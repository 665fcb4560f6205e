"""The run ledger: what ran, when, on what code, definitions and config, and how it ended.

An append-only Delta table next to the data (``<data_root>/_ledger`` unless
``ledger_root`` says otherwise), shared by every runner. Each run or backfill step
appends a ``running`` event when it starts and a ``succeeded``/``failed`` event when it
ends, written from the driver only (Spark task retries cannot add events). A step's
state is its latest event, so a crash leaves ``running`` for the next run to see, and a
repeated append of the same event changes nothing.

A write step also records where its keys can be found again (``keys_from``), and a cleanup
records what it did (``cleanup``): per source, the fields deleted, on how many keys and for
which write steps, and what it could not clean and why. Cleanup plans from these, so a
field is recorded as cleaned only once every key the ledger says it was written to was
visited.

A write step also records, per store, what identified it and what it held before and after
the write (``stores``), and a loss it found: store_state.py compares, and written_dates
does not count a date a store lost after it was written.

On a local disk every append holds the table's commit lock (jobs/operations/ledger/local_commits.py):
two processes appending at once could otherwise both commit the same version (one event
lost), or leave the log unreadable.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import subprocess
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from feature_defs import EntityDef, SourceDef
from fm_config import PROJECT_ROOT, RunConf
from fm_config.locations import Files, Location
from fm_config.stores import store_name
from jobs.operations.ledger.local_commits import commit_lock, guarded
from jobs.pipeline.source_table import table_ref
from jobs.transforms import key_columns
from serializers import freshness_field_name

log = logging.getLogger(__name__)
_EPOCH = dt.datetime.min.replace(tzinfo=dt.UTC)

SCHEMA = T.StructType(
    [
        T.StructField("run_id", T.StringType(), False),
        T.StructField("kind", T.StringType(), False),
        T.StructField("source", T.StringType()),
        T.StructField("entity", T.StringType()),
        T.StructField("start_date", T.DateType()),
        T.StructField("end_date", T.DateType()),
        T.StructField("sinks", T.ArrayType(T.StringType())),
        T.StructField("targets", T.StringType()),
        T.StructField("dates", T.ArrayType(T.DateType())),
        T.StructField("status", T.StringType(), False),
        T.StructField("rows_read", T.LongType()),
        T.StructField("entities", T.LongType()),
        T.StructField("bad_rows", T.LongType()),
        T.StructField("written", T.StringType()),
        T.StructField("started_at", T.TimestampType()),
        T.StructField("ended_at", T.TimestampType()),
        T.StructField("code_version", T.StringType()),
        T.StructField("definitions_hash", T.StringType()),
        T.StructField("config_hash", T.StringType()),
        T.StructField("features", T.ArrayType(T.StringType())),
        T.StructField("error", T.StringType()),
        T.StructField("recorded_at", T.TimestampType(), False),
        T.StructField("keys_from", T.StringType()),
        T.StructField("cleanup", T.StringType()),
        T.StructField("encodings", T.StringType()),
        T.StructField("stores", T.StringType()),
        T.StructField("window_start", T.TimestampType()),
        T.StructField("window_end", T.TimestampType()),
        T.StructField("window_requested_end", T.TimestampType()),
    ]
)
STATUSES = ("running", "succeeded", "failed")


@cache
def code_version() -> str:
    """The git commit of the code (with '+dirty' for local changes), else the package version."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5)
        if head.returncode == 0:
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--untracked-files=no"], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=5
            )
            return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        pass
    from importlib.metadata import PackageNotFoundError, version

    try:
        return "v" + version("feature-materializer")
    except PackageNotFoundError:
        return "unknown"


def config_hash(conf: RunConf) -> str:
    return hashlib.sha256(conf.model_dump_json().encode()).hexdigest()[:16]


def redis_target(conf: RunConf, redis_url: str | None = None) -> str:
    """The Redis a step writes, without secrets: the server and database, and the namespace."""
    return _redis_server(redis_url or conf.redis.url) + (f"#{conf.redis.namespace}" if conf.redis.namespace else "")


def sink_targets(conf: RunConf, redis_url: str | None = None) -> dict[str, str]:
    """Where each sink of the run writes, without secrets: Redis server, database and
    namespace; SQL server, database and schema. One spelling per target (see canonical_target)."""
    targets = {}
    if "redis" in conf.sinks:
        targets["redis"] = redis_target(conf, redis_url)
    if "sql" in conf.sinks:
        targets["sql"] = _sql_server(conf.sql.dsn) + (f"#{conf.sql.db_schema}" if conf.sql.db_schema else "")
    return targets


def canonical_target(sink: str, target: str | None) -> str | None:
    """A recorded target in the form sink_targets gives today: the same server written as
    ``redis://h:6379`` or ``redis://h:6379/0?x=1`` (or a DSN with other options) matches."""
    if not target:
        return target
    server, hash_, rest = target.partition("#")
    try:
        server = _redis_server(server) if sink == "redis" else _sql_server(server)
    except ValueError:
        return target  # not a URL or DSN this version can read: compared as written
    return server + hash_ + rest


def _redis_server(url: str) -> str:
    """scheme://host:port/db: no credentials, no options, defaults spelled out."""
    parts = urlsplit(url)
    scheme = (parts.scheme or "redis").lower()
    if scheme == "unix":
        return f"unix://{parts.path}"
    host = (parts.hostname or "localhost").lower()
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{parts.port or 6379}/{parts.path.strip('/') or '0'}"


def _sql_server(dsn: str) -> str:
    """postgresql://user@host:port/dbname of a libpq DSN or URL: no password, no options."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        info = conninfo_to_dict(dsn)
    except Exception as exc:  # psycopg's ProgrammingError: not a DSN
        raise ValueError(str(exc)) from None
    host = str(info.get("host") or "localhost").lower()
    user = f"{info['user']}@" if info.get("user") else ""
    return f"postgresql://{user}{host}:{info.get('port') or 5432}/{info.get('dbname') or ''}"


def keys_from(conf: RunConf, source: SourceDef, entity: EntityDef) -> dict[str, Any]:
    """Where the keys a step of ``source`` writes can be read again: cleanup never SCANs, and
    the source's definition may be gone by the time its fields are stale. A Delta location is
    recorded as {"location"} (as before tables came in kinds), Parquet with its "format", a
    catalog table as {"table"}; a source selected by event time has no date column."""
    day = None if source.by_event_time else source.date_column
    return {**table_ref(conf, source).record(), "key_columns": key_columns(source, entity), "date_column": day}


@dataclass
class Entry:
    """One step: a run of a date, a backfill step (a date or a range), or a cleanup."""

    kind: str
    source: str | None
    entity: str
    start_date: dt.date | None
    end_date: dt.date | None
    sinks: list[str]
    definitions_hash: str
    config_hash: str
    features: list[str] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)
    """Per sink, where it wrote (URL or DSN, no secrets): a date written elsewhere is not written here."""
    dates: list[dt.date] = field(default_factory=list)
    """The dates with data the step wrote (a range may hold dates without data)."""
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started_at: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.UTC))
    status: str = "running"
    rows_read: int | None = None
    entities: int | None = None
    bad_rows: int | None = None
    written: dict[str, Any] = field(default_factory=dict)
    ended_at: dt.datetime | None = None
    error: str | None = None
    keys_from: dict[str, Any] = field(default_factory=dict)
    """Write steps: the table, key and date columns its keys come from (see keys_from())."""
    encodings: dict[str, str] = field(default_factory=dict)
    """Write steps: each stored name's encoding (FeatureDef.encoding), as stored.lock records it."""
    cleanup: dict[str, Any] | None = None
    """Cleanups: {"cleaned": {source: {fields, keys, fields_removed, steps}}, "left": {source: {fields, keys, fields_removed, reason}}}."""
    stores: dict[str, Any] = field(default_factory=dict)
    """Write steps, per sink: what identified the store and what it held before and after the
    write, and a loss found before it (jobs/operations/ledger/store_state.py)."""
    window_start: dt.datetime | None = None
    """select_by event_time: the first event time the step covered (None: from the first row)."""
    window_end: dt.datetime | None = None
    """select_by event_time: the end of the event times it covered (excluded); an incremental run
    continues from the latest end a succeeded step recorded (jobs/operations/ledger/windows.py)."""
    window_requested_end: dt.datetime | None = None
    """select_by event_time: the end asked for, when later than the time the step read the
    table, which ``window_end`` is instead (rows of later event times are left to the next run)."""

    def row(self) -> tuple:
        # aware datetimes: PySpark would read naive ones in the driver's local time zone
        return (
            self.run_id, self.kind, self.source, self.entity, self.start_date, self.end_date, self.sinks,
            json.dumps(self.targets, sort_keys=True), self.dates, self.status,
            self.rows_read, self.entities, self.bad_rows, json.dumps(self.written, sort_keys=True, default=str),
            self.started_at, self.ended_at, code_version(), self.definitions_hash, self.config_hash,
            self.features, self.error, dt.datetime.now(dt.UTC),
            json.dumps(self.keys_from, sort_keys=True) if self.keys_from else None,
            json.dumps(self.cleanup, sort_keys=True) if self.cleanup is not None else None,
            json.dumps(self.encodings, sort_keys=True) if self.encodings else None,
            json.dumps(self.stores, sort_keys=True, default=str) if self.stores else None,
            self.window_start, self.window_end, self.window_requested_end,
        )  # fmt: skip


class Ledger:
    def __init__(self, spark: SparkSession, path: Path | str, files: Files | None = None):
        self.spark = spark
        self.path = str(path)
        self._leases = None
        self.files = files or Files()
        """How the driver reads the table's files without Spark (source_steps)."""

    def leases(self, seconds: float):
        """The writers' leases beside this ledger (one object per ledger: a backfill's steps run inside its lease)."""
        from jobs.operations.ledger.lease import Leases

        if self._leases is None or self._leases.seconds != seconds:
            self._leases = Leases(self.spark, self.path, seconds=seconds)
        return self._leases

    @classmethod
    def of(cls, spark: SparkSession, conf: RunConf) -> Ledger:
        return cls(spark, conf.ledger_path, conf.files)

    def exists(self) -> bool:
        """Whether the table is there: a fresh ledger (no table yet) reads as empty, locally or on object storage."""
        if Location(self.path).is_local:
            return (Path(self.path) / "_delta_log").is_dir()
        from delta.tables import DeltaTable

        return DeltaTable.isDeltaTable(self.spark, self.path)

    def create(self) -> None:
        """Make the table, or add the columns an older one lacks, before sources append at
        once: two appends that both make the table, or both change its schema, conflict."""
        empty = self.spark.createDataFrame([], SCHEMA).write.format("delta").mode("append")
        with commit_lock(self.path):  # on a local disk: one process makes it, the others then find it made
            if not self.exists():
                empty.save(self.path)
            elif set(SCHEMA.fieldNames()) - set(guarded(self.path, lambda: self.spark.read.format("delta").load(self.path).columns)):
                empty.option("mergeSchema", "true").save(self.path)

    def record(self, entry: Entry) -> None:
        """Append the entry's current state as an event (driver side, a blind Delta append)."""
        if entry.status not in STATUSES:
            raise ValueError(f"unknown status {entry.status!r}")
        df = self.spark.createDataFrame([entry.row()], SCHEMA)
        with commit_lock(self.path):
            guarded(self.path, lambda: df.write.format("delta").mode("append").option("mergeSchema", "true").save(self.path))

    def start(self, entry: Entry) -> Entry:
        self.record(entry)
        return entry

    def finish(self, entry: Entry, summary=None, error: BaseException | None = None) -> None:
        entry.ended_at = dt.datetime.now(dt.UTC)
        entry.status = "failed" if error else "succeeded"
        entry.error = f"{type(error).__name__}: {error}" if error else None
        if summary is not None:
            entry.rows_read, entry.entities, entry.bad_rows = summary.rows_read, summary.entities, summary.bad_rows
            entry.written = {
                name: {
                    k: v for k, v in stats.items() if k in ("entities", "values_set", "values_deleted", "rows_upserted", "fields_removed")
                }
                for name, stats in summary.sinks.items()
            }
            for name, stats in summary.sinks.items():
                if stats.get("store"):  # what the store held after the write (sinks/*/identity.py)
                    entry.stores.setdefault(name, {})["after"] = stats["store"]
        self.record(entry)

    def steps(self) -> DataFrame:
        """Every step in its latest state (one row per run_id)."""
        if not self.exists():
            return self.spark.createDataFrame([], SCHEMA)
        events = guarded(self.path, lambda: self.spark.read.format("delta").load(self.path))
        # a ledger written by an older version lacks the newer columns: they read as null
        for column in SCHEMA.fields:
            if column.name not in events.columns:
                events = events.withColumn(column.name, F.lit(None).cast(column.dataType))
        # a finished event outranks 'running' whatever the clocks say
        finished = (F.col("status") != "running").cast("int")
        latest = Window.partitionBy("run_id").orderBy(finished.desc(), F.col("recorded_at").desc())
        return events.withColumn("_n", F.row_number().over(latest)).where("_n = 1").drop("_n")

    def list(self, source: str | None = None, last: int = 20) -> list[dict]:
        df = self.steps()
        if source:
            df = df.where(F.col("source") == source)
        return [r.asDict() for r in df.orderBy(F.col("started_at").desc()).limit(last).collect()]

    def source_steps(self, source: str) -> list[dict]:
        """Every step of ``source`` in its latest state, as dicts: read without Spark
        (files.py, milliseconds where a Spark query takes seconds), else with it."""
        found = self._steps_without_spark(source)
        if found is not None:
            return found
        return [r.asDict() for r in self.steps().where(F.col("source") == source).collect()]

    def _steps_without_spark(self, source: str | None = None) -> list[dict] | None:
        """Every step (of ``source``) in its latest state, read by files.py; None when
        that reader cannot (the caller then asks Spark)."""
        from jobs.operations.ledger.files import read_steps

        try:
            return read_steps(self.files, self.path, tuple(SCHEMA.fieldNames()), source)
        except OSError as exc:  # a log feature that reader does not follow, a filesystem it cannot reach
            log.info("reading the ledger with Spark: %s", exc)
        return None

    def written_dates(self, source: str, targets: dict[str, str], steps: list[dict] | None = None) -> dict[dt.date, set[str]]:
        """Dates of ``source`` that succeeded steps wrote to every one of these sink targets,
        with the features they wrote (a latest-mode step counts for each date it read); not
        a date whose data a store lost after it was written (store_state.py). ``steps``:
        the source's steps when already read (source_steps)."""
        rows = [r for r in (self.source_steps(source) if steps is None else steps) if r["kind"] in WRITE_KINDS]
        losses = {(sink, target): loss_events(rows, sink, target) for sink, target in targets.items()}
        covered: dict[dt.date, dict[str, set[str]]] = {}
        for r in rows:
            if r["status"] != "succeeded":
                continue
            wrote = {sink: canonical_target(sink, t) for sink, t in by_store(r["targets"]).items()}
            for day in r["dates"] or []:
                for sink, target in wrote.items():
                    events = next((e for (s, t), e in losses.items() if s == sink and canonical_target(s, t) == target), [])
                    if lost_later(events, day, r["started_at"]):
                        continue
                    covered.setdefault(day, {}).setdefault(f"{sink}={target}", set()).update(r["features"] or [])
        out: dict[dt.date, set[str]] = {}
        for day, by_target in covered.items():
            wanted = [f"{sink}={canonical_target(sink, target)}" for sink, target in targets.items()]
            if all(w in by_target for w in wanted):
                out[day] = set.intersection(*(by_target[w] for w in wanted))
        return out

    def write_steps(self, entity: str) -> list[dict]:
        """Every step that wrote (or may have written) sources of ``entity``, oldest first,
        with its stored names and their encodings."""
        columns = ("run_id", "kind", "source", "start_date", "status", "features", "encodings")
        steps = self._steps_without_spark()
        if steps is not None:
            mine = [s for s in steps if s["entity"] == entity and s["kind"] != "cleanup" and s["source"] is not None]
            mine.sort(key=lambda s: (s["started_at"] is not None, s["started_at"] or _EPOCH, s["run_id"]))  # Spark's order: nulls first
            found = [{c: s[c] for c in columns} for s in mine]
        else:
            rows = self.steps().where((F.col("entity") == entity) & (F.col("kind") != "cleanup") & F.col("source").isNotNull())
            found = [r.asDict() for r in rows.orderBy("started_at", "run_id").select(*columns).collect()]
        for step in found:
            step["encodings"] = json.loads(step["encodings"]) if step["encodings"] else None
        return found

    def running(self, source: str) -> list[dict]:
        """Steps of ``source`` still marked running: live elsewhere, or crashed."""
        df = self.steps().where((F.col("source") == source) & (F.col("status") == "running"))
        return [r.asDict() for r in df.collect()]

    def redis_writes(self, entity: str, target: str) -> tuple[list[RedisWrite], list[dict]]:
        """Steps of ``entity`` that may have written to the Redis ``target`` (failed and crashed
        ones too), each with the field names no cleanup of that Redis has removed from its
        keys; and the succeeded cleanups recorded without saying what they did (older
        versions): their claims are not trusted, since they covered only the keys of the
        sources defined at the time."""
        rows = self._steps_without_spark()
        if rows is None:
            rows = [r.asDict() for r in self.steps().where(F.col("entity") == entity).collect()]
        rows = [r for r in rows if r["entity"] == entity]
        cleaned: dict[str, set[str]] = {}  # run_id of a write step -> names removed from its keys
        legacy = []
        for r in rows:
            if r["kind"] != "cleanup" or r["status"] == "running":
                continue
            if r["cleanup"] is None:
                if r["status"] == "succeeded":
                    legacy.append(r)
                continue
            if canonical_target("redis", by_store(r["targets"]).get("redis")) != canonical_target("redis", target):
                continue
            for done in json.loads(r["cleanup"]).get("cleaned", {}).values():
                for run_id in done["steps"]:
                    cleaned.setdefault(run_id, set()).update(done["fields"])
        writes = []
        for r in rows:
            if r["kind"] == "cleanup" or not r["source"] or not _may_have_written(r, target):
                continue
            names = {*(r["features"] or []), freshness_field_name(r["source"])} - cleaned.get(r["run_id"], set())
            if names:
                dates = tuple(r["dates"]) if r["status"] == "succeeded" and r["dates"] is not None else None
                where = json.loads(r["keys_from"]) if r["keys_from"] else None
                writes.append(RedisWrite(r["run_id"], r["source"], frozenset(names), where, dates, r["start_date"], r["end_date"]))
        return writes, legacy


# -- what the stores lost (jobs/operations/ledger/store_state.py finds it; written_dates honours it) --

WRITE_KINDS = ("run", "backfill-replay", "backfill-latest")
Event = tuple[dt.datetime, frozenset[dt.date], dict]
"""A loss recorded on a store: the start of the step that found it, the dates lost, that step."""


def aware(when: dt.datetime) -> dt.datetime:
    """A ledger time as UTC (PySpark gives naive local times, the file reader UTC ones)."""
    return when.astimezone(dt.UTC)


def by_store(text: str | None) -> dict[str, Any]:
    """A ledger row's JSON map by store (targets, stores, written), a store's old name
    (``cockroach``, recorded before fm_config/stores.py) read as its name now."""
    return {store_name(k): v for k, v in json.loads(text).items()} if text else {}


def stores_of(step) -> dict[str, Any]:
    return by_store(step.get("stores"))


def on_target(step, sink: str, target: str) -> bool:
    return canonical_target(sink, by_store(step["targets"]).get(sink)) == canonical_target(sink, target)


def loss_events(steps, sink: str, target: str) -> list[Event]:
    """Losses recorded on this store (``stores.<sink>.lost`` of the steps that found them), oldest first."""
    out = []
    for r in steps:
        lost = stores_of(r).get(sink, {}).get("lost")
        if lost and on_target(r, sink, target):
            out.append((aware(r["started_at"]), frozenset(dt.date.fromisoformat(d) for d in lost["dates"]), r))
    return sorted(out, key=lambda e: e[0])


def lost_later(events: list[Event], day: dt.date, started_at: dt.datetime) -> bool:
    """Whether a loss found after this step started took the date it wrote (the step that
    found a loss writes after finding it: its own date counts)."""
    return any(day in dates and at > aware(started_at) for at, dates, _ in events)


def _may_have_written(step, target: str) -> bool:
    targets = by_store(step["targets"])
    if targets:
        return canonical_target("redis", targets.get("redis")) == canonical_target("redis", target)
    return step["sinks"] is None or "redis" in step["sinks"]  # recorded before targets were: it may be this Redis


@dataclass(frozen=True)
class RedisWrite:
    """A step that may have written fields to a Redis: the names still on its keys, and how to find those keys."""

    run_id: str
    source: str
    names: frozenset[str]
    """Feature names and the source's freshness field name."""
    keys_from: dict[str, Any] | None
    """Where its keys come from (keys_from()); None when recorded before the ledger kept it."""
    dates: tuple[dt.date, ...] | None
    """The dates a succeeded step wrote; None: any of start..end (a failed or crashed step may have written some)."""
    start_date: dt.date | None
    end_date: dt.date | None
