"""SparkSession with Delta, for local runs, tests and spark-submit alike."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path

from fm_config import PROJECT_ROOT, CatalogConf, SparkConf
from fm_config.locations import resolve
from jobs.cluster_bundle import BUNDLE_DIR_VAR, BUNDLE_FILE_VAR, PROJECT_ZIP, RUNTIME_SUFFIX
from jobs.jars import S3A_SCHEMES, class_archive_options, delta_jars, s3a_jars

HUGE_METHODS = "-XX:-DontCompileHugeMethods"
"""A snapshot of 50 features makes Spark generate methods past HotSpot's 8,000-byte limit for
JIT compilation; left interpreted, the gate's scan and the checks ran 2-6x slower
(bench/README.md). On a cluster, put it in spark.executor.extraJavaOptions too."""


def needs_s3a(conf: SparkConf, locations: Iterable[str]) -> bool:
    """Whether a session reads or writes S3: a location on it, or fs.s3a settings in spark.extra."""
    return any(str(loc).startswith(S3A_SCHEMES) for loc in locations) or any(k.startswith("spark.hadoop.fs.s3a.") for k in conf.extra)


def build_spark(conf: SparkConf, locations: Iterable[str] = ()):
    """The session; ``locations`` (the run's tables, ledger, reports): S3 ones add the S3A
    connector's jars (left out otherwise: 36 jars on every classpath for nothing)."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Workers must run the same interpreter (and so see the same installed packages).
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(conf.app_name)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit already chose master and jars
    if not under_submit:
        jars = delta_jars() + (s3a_jars() if needs_s3a(conf, locations) else [])
        builder = builder.master(conf.master).config("spark.jars", ",".join(str(j) for j in jars))
        # before the JVM starts: 1g (Spark's default) spills a 1M-entity snapshot's cache to disk
        builder = builder.config("spark.driver.memory", conf.driver_memory)
        if "spark.driver.extraJavaOptions" not in conf.extra:
            # the class archive (jobs/class_archive.py), when the set-up made one: a faster start
            options = f"{HUGE_METHODS} {class_archive_options()} {derby_options(conf.catalog)}"
            builder = builder.config("spark.driver.extraJavaOptions", " ".join(options.split()))
    settings = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(conf.shuffle_partitions),
        "spark.sql.execution.arrow.maxRecordsPerBatch": str(conf.arrow_batch_rows),
        "spark.sql.files.maxPartitionBytes": conf.max_partition_bytes,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.databricks.delta.snapshotPartitions": "2",
        "spark.sql.adaptive.enabled": "true",
        # A snapshot row has a column per feature, and the gate's one aggregation a few per
        # feature: past Spark's default of 100 fields a plan loses whole-stage code
        # generation and runs interpreted (the gate took twice as long, bench/stage_profile.py).
        "spark.sql.codegen.maxFields": "1000",
        # One source's run generates ~140 distinct classes; past Spark's default cache of 100
        # each run compiled most again (and the JIT started over on each new class).
        "spark.sql.codegen.cache.maxEntries": "2000",
        # Parquet timestamps of nanoseconds (pandas writes them, Feast's example files hold them)
        # read as their count instead of failing the read; the source's reader makes them
        # timestamps again (jobs/pipeline/source_table.py).
        "spark.sql.legacy.parquet.nanosAsLong": "true",
        **catalog_settings(conf.catalog),
        **conf.extra,
        # Pinned, over spark.extra too (Spark 4's default, but a cluster may turn it off): the
        # transforms cast data with try_cast and check its nulls; any other cast then fails
        # the run instead of turning a bad value into a null, which would delete the stored value.
        "spark.sql.ansi.enabled": "true",
    }
    if os.environ.get(BUNDLE_FILE_VAR):
        settings["spark.jars"] = jars_without_bundle(os.environ[BUNDLE_FILE_VAR])
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if conf.catalog.type == "hive":
        quiet_hive_client(spark)
    if os.environ.get(BUNDLE_DIR_VAR):
        ship_bundle(spark.sparkContext, Path(os.environ[BUNDLE_DIR_VAR]))
    return spark


def catalog_settings(catalog: CatalogConf) -> dict[str, str]:
    """The session's settings for spark.catalog (static: they hold from the session's start).
    none and session set nothing: Spark's in-memory catalog, or the one the cluster configured."""
    if catalog.type != "hive":
        return {}
    out = {"spark.sql.catalogImplementation": "hive"}
    if catalog.metastore_uri:
        out["spark.hadoop.hive.metastore.uris"] = catalog.metastore_uri
    else:
        folder = resolve(catalog.metastore_dir, PROJECT_ROOT)
        out["spark.hadoop.javax.jdo.option.ConnectionURL"] = f"jdbc:derby:;databaseName={folder}/metastore_db;create=true"
    warehouse = catalog.warehouse or (str(resolve(catalog.metastore_dir, PROJECT_ROOT) / "warehouse") if catalog.metastore_dir else None)
    if warehouse:
        out["spark.sql.warehouse.dir"] = str(resolve(warehouse, PROJECT_ROOT))
    return out


HIVE_CLIENT_LOGGERS = ("hive.metastore", "org.apache.spark.sql.hive.client.HiveClientImpl", "org.apache.hadoop.hive.metastore")
"""Loggers of Hive's client that log each retry of an unreachable metastore as a warning with a
JVM stack trace: the run's own error says it in one line (jobs/pipeline/source_table.py)."""


def quiet_hive_client(spark) -> None:
    jvm = spark.sparkContext._jvm
    for name in HIVE_CLIENT_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, jvm.org.apache.logging.log4j.Level.ERROR)


def derby_options(catalog: CatalogConf) -> str:
    """An embedded metastore's Derby log in its folder, not derby.log in the working directory."""
    if catalog.type != "hive" or not catalog.metastore_dir:
        return ""
    return f"-Dderby.stream.error.file={resolve(catalog.metastore_dir, PROJECT_ROOT) / 'derby.log'}"


def jars_without_bundle(name: str) -> str:
    """spark.jars as spark-submit set it, less the job bundle (the application it submitted)."""
    from pyspark import SparkContext

    # Before the context exists, spark-submit's settings are the driver JVM's system
    # properties (a pure-Python SparkConf does not see them yet): start the gateway first.
    SparkContext._ensure_initialized()
    jars = SparkContext._jvm.java.lang.System.getProperty("spark.jars") or ""
    return ",".join(j for j in jars.split(",") if j and j.rsplit("/", 1)[-1] != name)


def ship_bundle(sc, bundle: Path) -> None:
    """A driver started from the job bundle (jobs/cluster_bundle.py) sends the executors
    their Python environment and the project's packages itself: the PEX lands in each
    executor's working directory before its first task (PYSPARK_PYTHON names it there),
    the zip on its workers' path."""
    sc.addFile(str(next(bundle.glob("*" + RUNTIME_SUFFIX))))
    sc.addPyFile(str(bundle / PROJECT_ZIP))
