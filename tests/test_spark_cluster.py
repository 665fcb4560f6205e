"""The packaged job on a real Spark standalone cluster (a master and a worker on loopback).

`scripts/package.sh` (`make package`) builds the project zip, the runtime PEX and the job
bundle. Client mode: the driver runs on this checkout's .venv; the executors run the PEX,
which holds the third-party packages but neither the project nor pyspark (the cluster's
Spark puts its own pyspark.zip on the workers' PYTHONPATH). So the job only works if
--py-files ships the zip, and the PEX only travels with --files, as on a real cluster.
Cluster mode: the driver runs on the worker from the bundle alone (the project, its conf,
great-expectations), and sends the executors their environment itself.
The stores are then read back raw and compared with the source rows, deduplicated here
in pandas (from the table's files, without Spark) and encoded with the scalar reference
encoder.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import unquote

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pyspark
import pytest
from redis.cluster import RedisCluster

from serializers import field_id
from throwaway.cluster import start_cluster

from .expected import entity_count, expected_hash
from .support.cli import ROOT
from .support.confs import env_conf
from .support.consumer_job import CONSUMER, check_consumer_rows
from .support.jvm import short_lived_jvm_options
from .support.samples import DAY2_STR
from .support.spark_submit import DELTA_JARS, cluster_mode_args

BIN = Path(sys.executable).parent
SPARK_HOME = Path(pyspark.__file__).resolve().parent
AS_OF = int(dt.datetime(2026, 11, 21, tzinfo=dt.UTC).timestamp())  # end of DAY2, UTC


# The cluster's JVMs (master, worker, drivers, executors) each live for a test: started as the
# suite's other short-lived JVMs (the class archive too: they run on Spark's own classpath).
JVM_OPTIONS = short_lived_jvm_options()


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without anything that could put the project or another
    Python environment in front of an executor's interpreter."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYSPARK_DRIVER_PYTHON") and not k.startswith("PEX_")
    }
    return {**env, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_DAEMON_JAVA_OPTS": JVM_OPTIONS, **extra}


@pytest.fixture(scope="module")
def package() -> tuple[Path, Path]:
    """`make package`: built once, then reused while its inputs are unchanged."""
    out = subprocess.run(["bash", str(ROOT / "scripts" / "package.sh")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    paths = dict(
        line.split("=", 1) for line in (ROOT / "dist" / "package.env").read_text().splitlines() if "=" in line and not line.startswith("#")
    )
    zip_path, pex = Path(paths["FM_PY_FILES"]), Path(paths["FM_RUNTIME_PEX"])
    assert zip_path.is_file() and pex.is_file() and os.access(pex, os.X_OK)
    return zip_path, pex


def _tail(path: Path, chars: int = 3000) -> str:
    return path.read_text(errors="replace")[-chars:] if path.exists() else f"({path} missing)"


def _wait_for(log: Path, pattern: str, process: subprocess.Popen, what: str, timeout: float = 90) -> re.Match:
    deadline = time.monotonic() + timeout
    while True:
        found = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found
        if process.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"{what} did not come up (exit {process.poll()}):\n{_tail(log)}")
        time.sleep(0.1)


def _stop(process: subprocess.Popen) -> None:
    """Its whole process group (a worker's executors too): SIGTERM, then SIGKILL."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(process.pid, signal.SIGKILL)  # leftovers of the group (executors)
    except ProcessLookupError:
        pass
    process.wait(timeout=15)


@contextmanager
def standalone_cluster(folder: Path, cores: int = 2, memory: str = "1g") -> Iterator[str]:
    """A master and a worker as foreground processes through pyspark's own bin/spark-class
    (the pip package has no sbin/start-master.sh); yields the master URL."""
    folder.mkdir(parents=True)
    spark_class = str(SPARK_HOME / "bin" / "spark-class")
    started: list[subprocess.Popen] = []

    def start(name: str, *args: str) -> tuple[subprocess.Popen, Path]:
        log = folder / f"{name}.log"
        with log.open("wb") as out:
            # own process group: stopping it also stops what it started (the executors)
            process = subprocess.Popen(
                [spark_class, *args], stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=folder, start_new_session=True
            )
        started.append(process)
        return process, log

    try:
        # Port 0 everywhere: the JVMs bind free ports themselves, read back from the logs.
        master, master_log = start(
            "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"
        )
        url = _wait_for(master_log, r"Starting Spark master at (spark://127\.0\.0\.1:\d+)", master, "Spark master")[1]
        _wait_for(master_log, r"I have been elected leader", master, "Spark master")
        worker, worker_log = start(
            "worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", str(cores), "--memory", memory,
            "--webui-port", "0", "--work-dir", str(folder / "work"), url,
        )  # fmt: skip
        _wait_for(master_log, rf"Registering worker 127\.0\.0\.1:\d+ with {cores} cores", worker, "Spark worker")
        _wait_for(worker_log, r"Successfully registered with master", worker, "Spark worker")
        yield url
    finally:
        for process in reversed(started):
            _stop(process)


def source_rows(table: Path, ds: str) -> pd.DataFrame:
    """One date of a Delta table, read without Spark: the files its log holds live (added
    and not removed since, replaying the commits in order) of that partition."""
    live: dict[str, str | None] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = action["add"]["partitionValues"].get("ds")
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    files = [table / unquote(path) for path, value in sorted(live.items()) if value == ds]
    assert files, f"no files of ds={ds} in {table}"
    return pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()


def expected_consumers(sample_root: Path) -> dict[int, pd.Series]:
    """The latest good row per consumer of DAY2 (bad: null key, embedding not 32 values,
    favorite_cuisine over 32 characters), de-duplicated here with pandas."""
    pdf = source_rows(sample_root / "consumer_daily", DAY2_STR)
    pdf = pdf[pdf["consumer_id"].notna()]
    pdf = pdf[pdf["taste_embedding"].map(lambda v: v is not None and len(v) == 32)]
    pdf = pdf[pdf["favorite_cuisine"].isna() | (pdf["favorite_cuisine"].str.len() <= 32)]
    latest = pdf.sort_values("updated_at", kind="stable").groupby("consumer_id").tail(1)
    return {int(r["consumer_id"]): r for _, r in latest.iterrows()}


def expected_hash_of(row: pd.Series) -> dict[bytes, bytes]:
    """A consumer's Redis hash as the scalar reference encoder writes it, from the source row."""
    return expected_hash(CONSUMER.features, row, field_id("_ts:consumer_daily"), AS_OF)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    """One loopback cluster for the module: (master URL, the worker's work folder). 3 cores and
    2 GiB: room for a cluster-mode driver (1 core, 1 GiB) beside a 2-core executor."""
    folder = tmp_path_factory.mktemp("spark-standalone") / "cluster"
    with standalone_cluster(folder, cores=3, memory="2g") as master:
        yield master, folder / "work"


def _new(work: Path, pattern: str, before: set[Path]) -> Path:
    """The one folder matching ``pattern`` that appeared in the worker's work folder since ``before``."""
    found = set(work.glob(pattern)) - before
    assert len(found) == 1, f"expected one new {pattern} in {work}, found {sorted(found)}"
    return found.pop()


def test_packaged_job_runs_on_a_standalone_cluster(package, standalone, sample_root, pg_server, pg_db, tmp_path):
    """Client mode, into a 3-primary Redis Cluster (found by asking the server) and the SQL store."""
    zip_path, pex = package
    redis_cluster = start_cluster(tmp_path / "redis-cluster", 3, 0, "--maxmemory", "64mb")
    try:
        _run_and_check(zip_path, pex, standalone, sample_root, redis_cluster, pg_server, pg_db, tmp_path)
    finally:
        redis_cluster.stop()


def _run_and_check(zip_path, pex, standalone, sample_root, redis_cluster, pg_server, pg_db, tmp_path):
    started = time.monotonic()
    # The PEX alone is the third-party packages: no project code, no pyspark.
    for module in ("sinks", "jobs", "pyspark"):
        alone = subprocess.run([str(pex), "-c", f"import {module}"], cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120)
        assert alone.returncode != 0 and f"No module named '{module}'" in alone.stderr, (module, alone.stderr[-2000:])
    assert subprocess.run([str(pex), "-c", "import pyarrow, redis, psycopg"], cwd=tmp_path, env=_env(), timeout=120).returncode == 0

    # The driver imports the project from the zip too (spark-submit puts --py-files first on
    # its PYTHONPATH): FM_PROJECT_ROOT (else the working directory) is where it finds feature_defs/.
    conf = env_conf(
        tmp_path / "conf",
        "cluster",
        f"data_root: {sample_root}\nreports_dir: {tmp_path / 'reports'}\nquarantine_root: {tmp_path / 'q'}\n"
        f"ledger_root: {tmp_path / 'ledger'}\nsinks: [redis, sql]\n"
        "spark: {shuffle_partitions: 2, arrow_batch_rows: 256}\n"
        f"redis: {{url: '{redis_cluster.url}', password_env: null, sample_entities: 50}}\n"
        "sql: {dsn: 'postgresql://nobody@127.0.0.1:9/none', password_env: null}\n"  # --sql-dsn overrides it
        "quality: {max_bad_fraction: 0.05, expectations: false, verify_sample: 100, data_docs: false}\n",
    )
    pex_root = tmp_path / "executor-pex-root"  # where the executors' PEX unpacks itself: proof it ran
    master, work = standalone
    apps = set(work.glob("app-*"))
    cluster_up = time.monotonic()
    out = subprocess.run(
        [
            str(BIN / "spark-submit"), "--master", master, "--deploy-mode", "client",
            "--py-files", str(zip_path),
            "--files", str(pex),
            "--jars", ",".join(map(str, DELTA_JARS)),
            "--driver-memory", "1g", "--executor-memory", "512m", "--total-executor-cores", "2",
            "--conf", f"spark.pyspark.python=./{pex.name}",  # the copy --files put in the executor's work dir
            "--conf", f"spark.pyspark.driver.python={sys.executable}",
            "--conf", f"spark.executorEnv.PEX_ROOT={pex_root}",
            "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.ui.enabled=false",
            "--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS}",
            "--driver-java-options", JVM_OPTIONS,
            str(ROOT / "jobs" / "materialize.py"), "--env", "cluster", "--date", DAY2_STR, "--source", "consumer_daily",
            "--sink", "all", "--sql-dsn", pg_server.dsn,  # the flags reach the job through spark-submit
        ],
        cwd=tmp_path, env=_env(FM_CONF_DIR=str(conf), FM_PROJECT_ROOT=str(ROOT)), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    job_done = time.monotonic()
    (tmp_path / "submit.out").write_text(out.stdout)
    (tmp_path / "submit.err").write_text(out.stderr)
    app = _new(work, "app-*", apps)
    executor_logs = "\n".join(_tail(p, 4000) for p in app.glob("*/stderr"))
    assert out.returncode == 0, f"spark-submit failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}\nexecutor:\n{executor_logs}"
    report = json.loads((tmp_path / "reports" / "consumer_daily" / DAY2_STR / "summary.json").read_text())
    assert report["status"] == "succeeded", report.get("error")
    # The job ran on the cluster's executor, which fetched the zip and the PEX and booted the PEX.
    shipped = {p.name for p in app.glob("*/*")}
    assert {zip_path.name, pex.name} <= shipped, shipped
    assert list((pex_root / "venvs").glob("*/*/*/bin/python")), f"the executors never booted the PEX:\n{executor_logs}"

    expected = expected_consumers(sample_root)
    assert len(expected) > 250
    # Redis Cluster: one hash per good consumer, on the primary that owns its slot, every
    # field byte for byte as the reference encoder writes it (read through redis-py's own
    # cluster client, not the job's routing).
    primaries = redis_cluster.primaries()
    assert sum(entity_count(redis_cluster.client(p)) for p in primaries) == len(expected)
    assert all(redis_cluster.client(p).dbsize() > 0 for p in primaries)
    reader = RedisCluster(host="127.0.0.1", port=primaries[0])
    for consumer_id, row in expected.items():
        key = f"c:{consumer_id}".encode()
        assert reader.hgetall(key) == expected_hash_of(row), f"c:{consumer_id}"
        assert 2592000 * 0.99 <= reader.ttl(key) <= 2592000 * 1.1
    reader.close()
    redis_report = report["sinks"]["redis"]
    assert redis_report["mode"] == "cluster" and sorted(redis_report["primaries"]) == sorted(f"127.0.0.1:{p}" for p in primaries)
    assert report["verification"]["redis"]["mismatches"] == 0 and report["verification"]["redis"]["checked"] > 0
    # SQL: one row per good consumer, the JSON object value by value against the source row.
    assert pg_db.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == len(expected)
    check_consumer_rows(pg_db, expected, dt.datetime.fromtimestamp(AS_OF, dt.UTC))
    assert report["entities"] == report["sinks"]["redis"]["entities"] == report["sinks"]["sql"]["rows_upserted"] == len(expected)
    print(
        f"\ncluster test: pex probes {cluster_up - started:.1f}s, spark-submit {job_done - cluster_up:.1f}s, "
        f"checks {time.monotonic() - job_done:.1f}s"
    )
    shutil.rmtree(pex_root, ignore_errors=True)  # ~250 MB unpacked


def test_bundled_job_runs_with_its_driver_on_the_cluster(package, standalone, sample_root, acl_redis, pg_server, pg_db, tmp_path):
    """Cluster mode: the driver runs on the worker from the job bundle alone: the project, the
    conf (deleted here before the submit), great-expectations (the gate is on), the
    environment it sends the executors. The Redis password comes from a mounted file and
    appears in no log, event log or report."""
    server, password = acl_redis
    secret = tmp_path / "secrets" / "redis_password"  # a mount every node has
    secret.parent.mkdir()
    secret.write_text(password)
    events = tmp_path / "events"
    events.mkdir()
    conf = env_conf(tmp_path / "conf", "prodlike",
        f"data_root: {sample_root}\nreports_dir: {tmp_path / 'reports'}\nquarantine_root: {tmp_path / 'q'}\n"
        f"ledger_root: {tmp_path / 'ledger'}\nsinks: [redis, sql]\n"
        "spark: {shuffle_partitions: 2, arrow_batch_rows: 256, extra: {"
        f"spark.eventLog.enabled: 'true', spark.eventLog.dir: '{events.as_uri()}', spark.eventLog.compress: 'false'}}}}\n"
        f"redis: {{url: '{server.url}', username: fm_writer, password_env: null, password_file: '{secret}', "
        f"sample_entities: 50, hash_max_listpack_value: 256}}\n"
        f"sql: {{dsn: '{pg_server.dsn}', password_env: null}}\n"
        "quality: {max_bad_fraction: 0.05, expectations: true, verify_sample: 100, data_docs: false}\n"
    )  # fmt: skip
    bundle = tmp_path / "job.jar"
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "package.sh")], cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "FM_CONF_DIR": str(conf), "FM_BUNDLE_OUT": str(bundle)},
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    shutil.rmtree(conf)  # only the bundle's copy is left

    master, work = standalone
    before = set(work.glob("driver-*")), set(work.glob("app-*"))
    pex_root = tmp_path / "pex-root"
    job = ["run", "--env", "prodlike", "--date", DAY2_STR, "--source", "consumer_daily"]
    started = time.monotonic()
    sizing = [
        "--driver-memory", "1g", "--executor-memory", "512m", "--total-executor-cores", "2",
        "--conf", f"spark.executorEnv.PEX_ROOT={pex_root}",
        "--conf", f"spark.executor.extraJavaOptions={JVM_OPTIONS}",
        "--driver-java-options", JVM_OPTIONS,
    ]  # fmt: skip
    submit = ["bash", str(ROOT / "scripts" / "submit-cluster.sh")]  # spark-submit, with the driver's outcome as exit status
    submit_env = _env(PEX_ROOT=str(pex_root), SPARK_SUBMIT=str(BIN / "spark-submit"))
    out = subprocess.run(
        [*submit, *cluster_mode_args(master, bundle, job, sizing)],
        cwd=tmp_path,
        env=submit_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    took = time.monotonic() - started
    driver = _new(work, "driver-*", before[0])
    driver_log = _tail(driver / "stderr", 6000) + _tail(driver / "stdout", 6000)
    executor_logs = "\n".join(_tail(p, 4000) for a in set(work.glob("app-*")) - before[1] for p in a.glob("*/stderr"))
    assert out.returncode == 0, f"spark-submit failed:\n{out.stderr[-3000:]}\ndriver:\n{driver_log}\nexecutor:\n{executor_logs}"
    app = _new(work, "app-*", before[1])

    # The driver ran in its folder on the worker from the unpacked bundle; the summary it printed is the run's.
    report = json.loads((tmp_path / "reports" / "consumer_daily" / DAY2_STR / "summary.json").read_text())
    assert report["status"] == "succeeded", report.get("error")
    assert len(report["expectations"]) > 10 and all(e["success"] for e in report["expectations"])  # great-expectations ran on the driver
    assert len(list((driver / ".fm-bundle").glob("*/project/conf/prodlike/m.yaml"))) == 1
    assert f"report: {tmp_path / 'reports' / 'consumer_daily' / DAY2_STR / 'summary.json'}" in (driver / "stdout").read_text()
    # Its executors ran the bundle's runtime PEX and packages, which the driver sent them (and
    # not the bundle itself, which spark-submit lists among the application's jars).
    shipped = {p.name for p in app.glob("*/*")}
    assert {"project.zip", "feature_materializer-0.1.0-runtime.pex"} <= shipped and bundle.name not in shipped, shipped
    assert list((pex_root / "venvs").glob("*/*/*/bin/python")), f"the executors never booted the PEX:\n{executor_logs}"

    expected = expected_consumers(sample_root)
    client = server.client()
    assert entity_count(client) == len(expected)
    for consumer_id, row in expected.items():
        assert client.hgetall(f"c:{consumer_id}") == expected_hash_of(row), f"c:{consumer_id}"
    assert pg_db.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == len(expected)
    check_consumer_rows(pg_db, expected, dt.datetime.fromtimestamp(AS_OF, dt.UTC))
    assert report["entities"] == report["sinks"]["redis"]["entities"] == len(expected)

    # The password was read from the file on every node and written nowhere.
    logs = [driver / "stdout", driver / "stderr", *app.glob("*/std*"), *events.rglob("*"), *(tmp_path / "reports").rglob("*")]
    assert any(events.rglob("*")), "no event log written"
    leaked = [str(p) for p in logs if p.is_file() and password.encode() in p.read_bytes()]
    assert not leaked and password not in out.stdout + out.stderr, leaked

    # A driver that fails fails the submit (what a scheduler sees; spark-submit itself exits 0),
    # with its error in the driver's log.
    before = set(work.glob("driver-*"))
    bad_job = ["run", "--env", "nosuch", "--date", DAY2_STR]
    failed = subprocess.run(
        [*submit, *cluster_mode_args(master, bundle, bad_job, sizing)],
        cwd=tmp_path,
        env=submit_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    driver = _new(work, "driver-*", before)
    assert failed.returncode == 1 and f"driver {driver.name} ended FAILED" in failed.stderr, failed.stdout[-2000:] + failed.stderr[-2000:]
    assert "unknown env 'nosuch'" in (driver / "stdout").read_text(), _tail(driver / "stdout")  # Python's stderr goes there too
    print(f"\ncluster mode: spark-submit {took:.1f}s, a failing one {time.monotonic() - started - took:.1f}s")
    shutil.rmtree(pex_root, ignore_errors=True)
