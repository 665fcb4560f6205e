"""The run configuration: every section in one frozen model (load.py reads it from
``conf/base/*.yaml`` overlaid by ``conf/<env>/*.yaml``).

Secrets never live in it: a section names the environment variable or the file that holds
one (``password_env``, ``password_file``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr

from fm_config.base import SecretRef, Settings
from fm_config.catalog import CatalogConf
from fm_config.locations import Files, Location, is_uri, resolve
from fm_config.reader import ReaderSettings, ServerSettings
from fm_config.redis import RedisConnection, RedisSettings, tls_files
from fm_config.sql import SqlConnection, SqlSettings
from fm_config.stores import StoreName


def _project_root() -> Path:
    """The checkout: FM_PROJECT_ROOT, else this file's, else (imported from the --py-files
    zip, as a spark-submit driver does) the working directory."""
    if os.environ.get("FM_PROJECT_ROOT"):
        return Path(os.environ["FM_PROJECT_ROOT"]).resolve()
    here = Path(__file__).resolve().parent
    return here.parent if here.is_dir() else Path.cwd().resolve()


PROJECT_ROOT = _project_root()
DEFAULT_ENV = "local"


class SparkConf(Settings):
    master: str = "local[2]"
    """Used when the job is not started by spark-submit (which sets its own master)."""
    app_name: str = "feature-materializer"
    driver_memory: Annotated[str, Field(pattern=r"^[0-9]+[kmgt]?$")] = "4g"
    """JVM heap of a run without spark-submit (local: driver and executors in one JVM), so
    the cached snapshot stays in memory; spark-submit sets its own (--driver-memory)."""
    shuffle_partitions: int = Field(4, ge=1)
    arrow_batch_rows: int = Field(5000, ge=1)
    """Rows per Arrow batch handed to the writers: bounds executor memory per task."""
    max_partition_bytes: Annotated[str, Field(pattern=r"^[0-9]+[kmg]?$")] = "16m"
    """Input split size (spark.sql.files.maxPartitionBytes): bounds the rows of each read
    task and of the snapshot's cached blocks, whatever the size of the ETL table's files."""
    rows_per_partition: int = Field(200_000, ge=1000)
    """A snapshot that repeats keys is de-duplicated over one partition per this many rows
    read (at least shuffle_partitions), so a task's memory does not grow with the snapshot.
    Not smaller: each task costs its own, and Feast's example (3,000,000 rows) took 4-5 s
    longer to prepare over 60 partitions of 50,000 (bench/README.md)."""
    extra: dict[str, str] = {}
    """Any further spark.* settings."""
    catalog: CatalogConf = CatalogConf()
    """Spark's catalog, for sources that name a ``table``: none by default."""


class QualityConf(Settings):
    max_bad_fraction: float = Field(0.01, ge=0, le=1)
    """Fail the run when more than this fraction of rows read is bad input."""
    expectations: bool = True
    """Run the great-expectations gate before writing (validate always runs it)."""
    max_null_fraction: float = Field(0.25, ge=0, le=1)
    """Default per-feature limit of entities without a value (a feature may set its own)."""
    row_count_band: float | None = Field(0.5, ge=0)
    """Entities may differ from the previous successful run by at most this fraction; None: no check."""
    verify_sample: int = Field(1000, ge=0)
    """Entities read back from each store after the write and compared with the source (0: off)."""
    max_skipped_newer: float = Field(0.5, ge=0, le=1)
    """A run (not a backfill) fails when a store left more than this fraction of its entities
    because it holds a newer snapshot of the source: the run changed almost nothing (1: off)."""
    data_docs: bool = True
    """Write the great-expectations HTML data docs next to each run's summary."""


class StorageConf(Settings):
    """How the driver reaches object storage for its own files (reports, data docs); Spark's
    connectors take theirs from ``spark.extra`` (``spark.hadoop.fs.s3a.*``). Credentials are
    never here: the AWS environment variables, profile or instance role."""

    s3_endpoint: str | None = None
    """An S3-compatible endpoint URL (MinIO, a test server); None: AWS's."""
    s3_region: str | None = None


class LeaseConf(Settings):
    seconds: float = Field(300, ge=5)
    """How long a writer's lease lasts without renewal (renewed every third of it): how long a
    crashed driver keeps its source locked."""
    wait_seconds: float = Field(0, ge=0)
    """How long a run waits for another writer of its source and store to finish (--wait-for-lease) before it stops."""


class MetricsConf(Settings):
    """Where a run reports itself to Prometheus, as batch jobs do (conf/base/monitoring/README.md)."""

    pushgateway_url: str | None = None
    """A Prometheus Pushgateway (http://host:9091): each source's run pushed under {job, env, source}."""
    textfile_dir: str | None = None
    """Or node_exporter's textfile collector folder: a file per source (fm_<env>_<source>.prom)."""
    job: str = "feature_materializer"
    timeout_seconds: float = Field(5, gt=0)
    """A push that takes longer is given up with a warning: the run's outcome never depends on it."""


class RunConf(Settings):
    env: str = DEFAULT_ENV
    data_root: str = "data"
    """Where the sources' relative locations are (Delta tables, Parquet files): a local path
    (relative: under the project root) or a URI (s3a://, abfss://, gs://, hdfs://, file://)."""
    quarantine_root: str | None = None
    """Delta tables of bad rows (a path or URI); defaults to <data_root>/_quarantine."""
    ledger_root: str | None = None
    """The run ledger, a Delta table (a path or URI); defaults to <data_root>/_ledger."""
    reports_dir: str = "reports"
    """Run summaries, validation results and data docs (a path or URI)."""
    storage: StorageConf = StorageConf()
    lease: LeaseConf = LeaseConf()
    """One writer per (source, store): leases beside the ledger (jobs/operations/ledger/lease.py)."""
    definitions_dir: str | None = None
    """Feature definitions folder; defaults to the project's feature_defs/."""
    sinks: Annotated[list[StoreName], Field(min_length=1)] = ["redis", "sql"]
    """The stores a run writes when no --sink is given (same as --sink all): redis, sql (fm_config/stores.py)."""
    spark: SparkConf = SparkConf()
    redis: RedisSettings = RedisSettings()
    sql: SqlSettings = SqlSettings()
    quality: QualityConf = QualityConf()
    reader: ReaderSettings = ReaderSettings()
    """Online reads (feature_reader/): stores per source, deadline, in-process cache."""
    server: ServerSettings = ServerSettings()
    """``materialize serve``: where it listens, its limits."""
    metrics: MetricsConf = MetricsConf()
    """Each run's outcome for Prometheus (a Pushgateway or node_exporter's textfile collector): none by default."""
    sources: list[str] | None = None
    """Sources a run materializes when none is named; None means all defined."""
    parallel_sources: Annotated[int, Field(ge=1)] = 2
    """How many sources a run, validate or verify works on at once in its one Spark session
    (one's driver work overlaps another's Spark jobs); their store writes take turns."""

    def path(self, value: str | None) -> Path | None:
        """A file of this machine (definitions, a password file): relative to the project root."""
        if value is None:
            return None
        p = Path(value)
        return p if p.is_absolute() else PROJECT_ROOT / p

    @property
    def data_path(self) -> Location:
        return resolve(self.data_root, PROJECT_ROOT)

    def table_path(self, location: str) -> Location:
        """A source's ``location``: a URI or absolute path as it is, else under data_root."""
        if is_uri(location) or os.path.isabs(location):
            return Location(location)
        return self.data_path / location

    @property
    def quarantine_path(self) -> Location:
        return resolve(self.quarantine_root, PROJECT_ROOT) if self.quarantine_root else self.data_path / "_quarantine"

    @property
    def ledger_path(self) -> Location:
        return resolve(self.ledger_root, PROJECT_ROOT) if self.ledger_root else self.data_path / "_ledger"

    @property
    def reports_path(self) -> Location:
        return resolve(self.reports_dir, PROJECT_ROOT)

    def locations(self, defs=None) -> list[Location]:
        """Every location a run reads or writes: tables (the sources' own URIs and the catalog's
        warehouse included), quarantine, ledger, reports."""
        out = [self.data_path, self.quarantine_path, self.ledger_path, self.reports_path]
        if self.spark.catalog.warehouse and "://" in self.spark.catalog.warehouse:
            out.append(Location(self.spark.catalog.warehouse))
        if defs is not None:
            out += [Location(s.location) for s in defs.sources.values() if s.location and "://" in s.location]
        return out

    @property
    def files(self) -> Files:
        """Reads and writes the driver's own files (reports) wherever they live."""
        return Files(self.storage.s3_endpoint, self.storage.s3_region)

    def redis_password(self) -> SecretStr | None:
        return self.redis.password(self.path)

    def sql_password(self) -> SecretStr | None:
        return self.sql.password(self.path)

    def redis_connection(self, url: str | None = None) -> RedisConnection:
        """How to reach redis.url (``url``: another server). It names where the password is;
        the password is read here first (a missing one fails before anything starts) and
        again wherever a connection is made."""
        self.redis_password()
        r = self.redis
        tls = tls_files(r, self.path)
        return RedisConnection(
            url=url or r.url, username=r.username, secret=self._secret("redis", r), tls=tls, socket_timeout=r.socket_timeout
        )

    def sql_connection(self) -> SqlConnection:
        """How to reach sql.dsn; its password as redis_connection's."""
        self.sql_password()
        s = self.sql
        return SqlConnection(
            dsn=s.dsn,
            schema=s.db_schema,
            statement_timeout_ms=s.statement_timeout_ms,
            connect_timeout=s.connect_timeout,
            secret=self._secret("sql", s),
        )

    def reader_redis_connection(self, url: str | None = None) -> RedisConnection:
        """How the read side reaches redis.url: as reader.redis's user when it is set (the
        writer's password is then neither needed nor read), else as redis_connection. The
        server, TLS files and timeouts are redis's."""
        return self._redis_as(self.reader.redis, "reader.redis", url)

    def reader_sql_connection(self) -> SqlConnection:
        """How the read side reaches sql.dsn: as reader.sql's role (in place of the dsn's
        user) when it is set, else as sql_connection."""
        return self._sql_as(self.reader.sql, "reader.sql")

    def push_redis_connection(self, url: str | None = None) -> RedisConnection:
        """How pushes reach redis.url: as server.push.redis's user when set, else as the run's writer."""
        return self._redis_as(self.server.push.redis, "server.push.redis", url)

    def push_sql_connection(self) -> SqlConnection:
        """How pushes reach sql.dsn: as server.push.sql's role when set, else as the run's writer."""
        return self._sql_as(self.server.push.sql, "server.push.sql")

    def _redis_as(self, creds, section: str, url: str | None) -> RedisConnection:
        if creds is None:
            return self.redis_connection(url)
        creds.password(self.path)  # a missing password fails here, before anything starts
        r = self.redis
        return RedisConnection(
            url=url or r.url,
            username=creds.username,
            secret=self._secret(section, creds),
            tls=tls_files(r, self.path),
            socket_timeout=r.socket_timeout,
        )

    def _sql_as(self, creds, section: str) -> SqlConnection:
        if creds is None:
            return self.sql_connection()
        creds.password(self.path)
        s = self.sql
        dsn = s.dsn
        if creds.user:
            from psycopg.conninfo import make_conninfo

            dsn = make_conninfo(dsn, user=creds.user)
        return SqlConnection(
            dsn=dsn,
            schema=s.db_schema,
            statement_timeout_ms=s.statement_timeout_ms,
            connect_timeout=s.connect_timeout,
            secret=self._secret(section, creds),
        )

    def _secret(self, section: str, settings) -> SecretRef | None:
        if not (settings.password_env or settings.password_file):
            return None
        return SecretRef(section, settings.password_env, str(self.path(settings.password_file)) if settings.password_file else None)
