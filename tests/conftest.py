"""Shared fixtures: one local[2,2] Spark session, real redis-servers and a real PostgreSQL
on free loopback ports, and small sample Delta tables written once per session."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg import sql

from fm_config import CatalogConf, QualityConf, RunConf, SparkConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.sample_data import sample_dates, write_sample_tables
from throwaway.metastore import HiveMetastore, start_metastore
from throwaway.servers import PostgresServer, RedisServer, start_postgres, start_redis

SAMPLE_DATES = sample_dates(2)  # 2026-11-19, 2026-11-20
DAY2_STR = SAMPLE_DATES[1].isoformat()
SAMPLE_CONSUMERS = 300
SAMPLE_STORES = 60


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis"), "--maxmemory", "256mb", "--hash-max-listpack-value", "256")
    yield server
    server.stop()


@pytest.fixture
def redis_db(redis_server) -> redis.Redis:
    """The session's Redis, emptied for this test."""
    client = redis_server.client()
    client.flushall()
    return client


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def pg_db(pg_server) -> Iterator[psycopg.Connection]:
    """The session's PostgreSQL database, emptied for this test (public schema recreated)."""
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
        yield conn


@pytest.fixture(scope="session")
def spark_events(tmp_path_factory) -> Path:
    """Where the session's Spark event log goes (test_secrets searches it)."""
    return tmp_path_factory.mktemp("spark-events")


@pytest.fixture(scope="session")
def hive_metastore(tmp_path_factory) -> Iterator[HiveMetastore]:
    """The session's Spark catalog: a Hive metastore service on loopback (throwaway/metastore.py),
    coming up in the background while the Spark session starts (its static settings name it)."""
    metastore = start_metastore(tmp_path_factory.mktemp("metastore"))
    yield metastore
    metastore.stop()


def session_catalog(metastore: HiveMetastore) -> CatalogConf:
    return CatalogConf(type="hive", metastore_uri=metastore.uri, warehouse=str(metastore.folder / "warehouse"))


@pytest.fixture(scope="session")
def catalog(hive_metastore) -> CatalogConf:
    """spark.catalog of the session (and of CLI runs that share its catalog). The service comes
    up while the first tests run: a catalog call before waits in its socket's backlog."""
    hive_metastore.wait()
    return session_catalog(hive_metastore)


@pytest.fixture(scope="session")
def spark(spark_events, hive_metastore):
    from jobs.jars import class_archive_options
    from jobs.spark import HUGE_METHODS, build_spark

    # local[2,2]: a failed task gets a second attempt, as on a cluster (local[N] never retries)
    extra = {
        "spark.eventLog.enabled": "true", "spark.eventLog.dir": spark_events.as_uri(),
        "spark.eventLog.compress": "false",  # plain text: searchable
        # the throughput collector: the suite's small jobs in one JVM ran 4-13% faster than
        # with the default G1 on 2 cores (tests/README.md)
        "spark.driver.extraJavaOptions": f"{HUGE_METHODS} {class_archive_options()} -XX:+UseParallelGC",
    }  # fmt: skip
    catalog = session_catalog(hive_metastore)  # the service comes up beside the session: a first catalog call waits for it
    session = build_spark(
        SparkConf(master="local[2,2]", shuffle_partitions=2, arrow_batch_rows=256, app_name="fm-tests", extra=extra, catalog=catalog)
    )
    # The JVMs the tests start later (CLI runs, Airflow tasks, spark-submit) live for one
    # small job each: the quick JIT alone starts them several seconds faster.
    # spark-submit's JVMs (Airflow's task, the cluster tests' drivers) start from the class
    # archive too; the CLI's own add it themselves (jobs/spark.py).
    os.environ.setdefault("SPARK_SUBMIT_OPTS", short_lived_jvm_options())
    yield session
    session.stop()


def short_lived_jvm_options() -> str:
    """For a JVM that runs one small job: the quick JIT, the serial collector, the class archive.

    C1 alone reserves 48 MB for compiled code, not tiered's 240: a run of both sample
    sources filled it in 23 s, the JVM stopped compiling, then failed to link method handles
    and took the SparkContext down mid-run. Hence the tiered size."""
    from jobs.jars import class_archive_options

    return f"-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC {class_archive_options()}".strip()


@pytest.fixture(scope="session")
def sample_root(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_sample_tables(spark, root, SAMPLE_DATES, consumers=SAMPLE_CONSUMERS, stores=SAMPLE_STORES)
    return root


@pytest.fixture
def run_conf(sample_root, redis_server, tmp_path) -> RunConf:
    """Config of a run over the sample tables into the session's Redis."""
    return RunConf(
        env="test",
        data_root=str(sample_root),
        quarantine_root=str(tmp_path / "quarantine"),
        reports_dir=str(tmp_path / "reports"),
        spark=SparkConf(),
        redis=RedisSettings(url=redis_server.url, password_env=None, pipeline_entities=64, sample_entities=50),
        # The gate has its own tests (test_quality.py); here it would only repeat itself.
        quality=QualityConf(max_bad_fraction=0.05, expectations=False, verify_sample=100),
        sinks=["redis"],
        reader=ReaderSettings(timeout_ms=10_000),  # the default 50 ms is for a quiet server; the suite shares 2 busy cores
    )


@pytest.fixture
def sql_conf(run_conf, pg_server, pg_db) -> RunConf:
    """run_conf writing only to the SQL store (the session's PostgreSQL, emptied)."""
    sql = SqlSettings(dsn=pg_server.dsn, password_env=None, retry_base_delay=0.01, retry_max_delay=0.05)
    return run_conf.model_copy(update={"sinks": ["cockroach"], "sql": sql})


TINY_SOURCE = "source:\n  name: tiny\n  entity: consumer\n  location: tiny\n  layout: wide\n  features:\n"


def tiny_consumer_source(spark, tmp_path: Path, features_yaml: str, schema: str, rows: list, extra_yaml: str = ""):
    """A consumer source 'tiny' of its own (definitions folder and Delta table under
    ``tmp_path``), for tests that need values the sample data does not have. Returns the
    definitions; run it with ``data_root=tmp_path``."""
    from feature_defs import DEFAULT_DIR, load_definitions

    folder = tmp_path / "defs"
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "tiny.yaml").write_text(TINY_SOURCE + features_yaml + extra_yaml)
    defs = load_definitions(folder)
    # not via pandas, which would turn NaN into null
    spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(str(tmp_path / "tiny"))
    return defs


def env_conf(folder: Path, env: str, settings: str) -> Path:
    """A conf folder of its own (point FM_CONF_DIR at it): an empty base and ``env`` with these settings (YAML)."""
    (folder / "base").mkdir(parents=True)
    (folder / env).mkdir()
    (folder / env / "m.yaml").write_text(settings)
    return folder


TINY_LONG_SOURCE = (
    "source:\n  name: tiny_long\n  entity: consumer\n  location: tiny_long\n  layout: long\n"
    "  name_column: feature_name\n  value_column: value\n  features:\n"
)


def tiny_long_consumer_source(spark, tmp_path: Path, features_yaml: str, value_type: str, rows: list):
    """A long-layout consumer source 'tiny_long' of its own: rows (consumer_id, feature_name,
    value, ds) with a value column of Spark type ``value_type``. Returns the definitions;
    run it with ``data_root=tmp_path``."""
    from feature_defs import DEFAULT_DIR, load_definitions

    folder = tmp_path / "defs"
    folder.mkdir(exist_ok=True)
    (folder / "entities.yaml").write_text((DEFAULT_DIR / "entities.yaml").read_text())
    (folder / "tiny_long.yaml").write_text(TINY_LONG_SOURCE + features_yaml)
    defs = load_definitions(folder)
    schema = f"consumer_id long, feature_name string, value {value_type}, ds date"
    spark.createDataFrame(rows, schema).write.format("delta").mode("overwrite").save(str(tmp_path / "tiny_long"))
    return defs


# -- least privilege: the documented Redis ACL and SQL grants, as written (conf/README.md) --

ROOT = Path(__file__).resolve().parent.parent
ACL_FILE = ROOT / "conf" / "base" / "redis-acl.txt"
GRANTS_FILE = ROOT / "conf" / "base" / "sql-grants.sql"
PLACEHOLDER = ">CHANGE_ME"
ROLES = ("fm_schema", "fm_writer", "fm_reader", "fm_cleanup")
ACL_USERS = ("fm_writer", "fm_reader")


def acl_commands(password: str) -> list[list[str]]:
    """The documented ACL SETUSER lines (one per user), each with a real password in place of the placeholder."""
    lines = [line.split() for line in ACL_FILE.read_text().splitlines() if line.strip()]
    assert [args[:3] for args in lines] == [["ACL", "SETUSER", user] for user in ACL_USERS]
    assert all(args.count(PLACEHOLDER) == 1 for args in lines)
    return [[f">{password}" if a == PLACEHOLDER else a for a in args] for args in lines]


@pytest.fixture
def acl_redis(tmp_path):
    """A fresh redis-server (listpack limit 256, as deployments should run) with the documented users (one password)."""
    server = start_redis(tmp_path / "redis", "--maxmemory", "256mb", "--hash-max-listpack-value", "256")
    password = secrets.token_hex(16)
    for command in acl_commands(password):
        assert server.client().execute_command(*command) == b"OK"
    yield server, password
    server.stop()


@pytest.fixture
def sql_roles(pg_server, pg_db, monkeypatch, tmp_path):
    """The documented roles and grants, executed as written, with passwords given by env var
    (for the CLI's processes) and mounted files (for this session's executors)."""
    pg_db.execute(GRANTS_FILE.read_text())
    passwords = {role: secrets.token_hex(12) for role in ROLES}
    for role, password in passwords.items():
        # ALTER ROLE takes no bind parameters: psycopg quotes the literal
        pg_db.execute(sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
        monkeypatch.setenv(f"FM_TEST_{role.upper()}_PASSWORD", password)
        (tmp_path / f"{role}_password").write_text(password)
    yield {role: f"postgresql://{role}@127.0.0.1:{pg_server.port}/{pg_server.database}" for role in ROLES}
    for role in ROLES:  # one at a time: PostgreSQL 15 trips over the shared default ACL otherwise
        pg_db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    pg_db.execute(sql.SQL("DROP ROLE {}").format(sql.SQL(", ").join(map(sql.Identifier, ROLES))))


def pytest_collection_modifyitems(config, items):
    # the fast tier (`make test-fast`, -m "not spark"): whatever uses the Spark session is marked here
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


def pytest_unconfigure(config):
    # Airflow's dag.test() installs log handlers on the streams pytest captured; py4j then
    # logs from a __del__ at interpreter exit, after pytest closed them: not an error of ours.
    logging.raiseExceptions = False


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A loopback port held by a socket bound, not listening: a server cannot bind it, a
    connection there is refused (as with a port some outgoing connection uses as its source)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


def first_then_real(first, real):
    """A stand-in for a port picker: ``first`` on its first call, then what ``real`` picks; and the calls."""
    calls = []

    def pick(*args):
        calls.append(args)
        return first if len(calls) == 1 else real(*args)

    return pick, calls
