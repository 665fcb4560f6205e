"""Shared fixtures: one local[2,2] Spark session, real redis-servers and a real PostgreSQL
on free loopback ports, and small sample Delta tables written once per session."""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg import sql

from feature_defs import Definitions
from fm_config import CatalogConf, QualityConf, RunConf, SparkConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.sample_data import write_sample_tables
from throwaway.metastore import HiveMetastore, start_metastore
from throwaway.servers import PostgresServer, RedisServer, start_postgres, start_redis

from .support.jvm import short_lived_jvm_options
from .support.privileges import GRANTS_FILE, ROLES, acl_commands
from .support.reader_sample import write_sample
from .support.samples import SAMPLE_CONSUMERS, SAMPLE_DATES, SAMPLE_STORES
from .support.tls import Certs, make_certs


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
    jvm = session.sparkContext._gateway.proc  # the spark-submit process that holds the JVM
    session.stop()
    # The JVM leaves when its stdin closes. Waited for here, not left to exit after this
    # process: its CPU time then counts among this process's (the lanes' CPU line).
    jvm.stdin.close()
    jvm.wait(timeout=120)


@pytest.fixture(scope="session")
def sample_root(spark, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_sample_tables(spark, root, SAMPLE_DATES, consumers=SAMPLE_CONSUMERS, stores=SAMPLE_STORES)
    return root


@pytest.fixture(scope="session")
def written_sample(spark, tmp_path_factory, pg_server) -> Iterator[tuple[RunConf, Definitions]]:
    """every_type and pair_daily written by the real job once per session (per xdist worker)
    into a redis-server and a PostgreSQL database of their own (tests/support/reader_sample.py),
    so no other test's flush or emptied schema reaches them: what the reader's and the
    feature server's tests read (test_reader, test_server, test_server_limits,
    test_server_fuzz). They read it and leave it as written. (conf, definitions)."""
    server = start_redis(tmp_path_factory.mktemp("written-redis"), "--maxmemory", "256mb", "--hash-max-listpack-value", "256")
    with pg_server.connect() as conn:
        conn.execute("CREATE DATABASE written")
    redis_settings = RedisSettings(url=server.url, password_env=None, mode="standalone")
    yield write_sample(spark, tmp_path_factory.mktemp("written"), redis_settings, replace(pg_server, database="written").dsn)
    server.stop()


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
    return run_conf.model_copy(update={"sinks": ["sql"], "sql": sql})


# -- least privilege: the documented Redis ACL and SQL grants (tests/support/privileges.py) --


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


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certs:
    """A module's throwaway CA and server certificates (tests/support/tls.py)."""
    return make_certs(tmp_path_factory.mktemp("certs"))
