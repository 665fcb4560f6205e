"""The Airflow DAGs: integrity and policy, a real dag.test() of the nightly DAG into the
suite's Redis and PostgreSQL, and the backfill DAG's params reaching the CLI."""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# Airflow reads its home when first imported: a private one for the suite.
AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="fm-airflow-"))
os.environ["AIRFLOW_HOME"] = str(AIRFLOW_HOME)
os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(Path(__file__).resolve().parent.parent / "airflow" / "dags")
os.environ["AIRFLOW_CONN_FM_SPARK"] = json.dumps({"conn_type": "spark", "host": "local[2]"})

from jobs.operations.ledger.events import Ledger  # noqa: E402
from jobs.spark import HUGE_METHODS  # noqa: E402
from serializers import decode, field_id  # noqa: E402

from .expected import entity_count, expected_hash  # noqa: E402
from .support.confs import env_conf  # noqa: E402
from .support.events import FRESH, SPECS, at, epoch, write_events  # noqa: E402
from .support.samples import SAMPLE_DATES  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DAGS = ROOT / "airflow" / "dags"
BIN = Path(sys.executable).parent
DAY1, DAY2 = SAMPLE_DATES
POOL = "fm_redis_writes"


def airflow_cli(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([str(BIN / "airflow"), *args], capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def airflow_db():
    airflow_cli("db", "migrate")
    airflow_cli("pools", "set", POOL, "1", "one heavy upload to the Redis cluster at a time")
    return AIRFLOW_HOME


def load_dags(monkeypatch=None, **env):
    """A fresh DagBag of airflow/dags (after env changes the DAG files read at parse time)."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    from jobs import airflow_support

    importlib.reload(airflow_support)
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def test_dag_files_load_and_follow_the_policy():
    bag = load_dags()
    assert bag.import_errors == {}, f"DAG import errors: {bag.import_errors}"
    assert set(bag.dags) == {"fm_nightly_nightly", "fm_backfill", "fm_cleanup"}  # no source of feature_defs selects by event time
    for dag_id, dag in bag.dags.items():
        assert "feature-materializer" in dag.tags, dag_id
        assert dag.catchup is False and dag.max_active_runs == 1, dag_id
        assert dag.default_args["retries"] >= 1 and dag.default_args["retry_exponential_backoff"], dag_id
        assert dag.default_args["owner"] == "ml-platform", dag_id
        for t in dag.tasks:
            assert t.execution_timeout is not None, f"{dag_id}.{t.task_id} has no timeout"
            assert t.retries >= 1, f"{dag_id}.{t.task_id} has no retries"  # a failed gate fails fast instead (see below)
            writes = t.task_id.endswith("materialize") or t.task_id == "backfill" or t.task_id.startswith("cleanup_")
            assert (t.pool == POOL) == writes, f"{dag_id}.{t.task_id}: pool {t.pool}"
    nightly = bag.dags["fm_nightly_nightly"]
    for source in ("consumer_daily", "store_features_long"):
        # the run gates and verifies what it read: no task reads and prepares the snapshot again
        chain = [f"{source}.{name}" for name in ("wait_for_partition", "materialize", "report")]
        assert sorted(t.task_id for t in nightly.tasks if t.task_id.startswith(f"{source}.")) == sorted(chain)
        for upstream, downstream in zip(chain, chain[1:]):
            assert downstream in nightly.get_task(upstream).downstream_task_ids
        sensor = nightly.get_task(f"{source}.wait_for_partition")
        assert sensor.mode == "reschedule" and sensor.timeout
    assert nightly.get_task("consumer_daily.materialize").application_args[:4] == [
        "--env",
        "local",
        "--date",
        "{{ macros.ds_add(ds, -1) }}",
    ]
    for side in ("driver", "executor"):  # Spark's big generated methods JIT-compiled, as in local runs (jobs/spark.py)
        assert nightly.get_task("consumer_daily.materialize").conf[f"spark.{side}.extraJavaOptions"] == HUGE_METHODS
    assert sorted(t.task_id for t in bag.dags["fm_cleanup"].tasks) == ["cleanup_consumer", "cleanup_store"]  # one per entity type
    for t in nightly.tasks:  # no secrets in the (serialized) DAG: tasks add only these to the worker's env
        env = getattr(t, "env", None) or getattr(t, "_env_vars", None) or getattr(t, "env_vars", None) or {}
        assert set(env) <= {"FM_ENV", "PATH"}, (t.task_id, sorted(env))


def test_every_name_the_dags_read_from_airflow_support_is_there():
    # a task reads them when it runs, not when the DAG is parsed: a missing one fails only
    # inside the task (then its retries), so check them here
    import ast

    from jobs import airflow_support

    used = {
        node.attr
        for path in [*DAGS.glob("*.py"), ROOT / "jobs" / "airflow_tasks.py"]
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "fm"
    }
    assert {"EXIT_OK", "EXIT_NOT_READY", "BIN_DIR", "task_env"} <= used
    assert sorted(name for name in used if not hasattr(airflow_support, name)) == []


def test_parsing_imports_nothing_heavy():
    code = (
        "import sys\nfrom airflow.dag_processing.dagbag import DagBag\n"
        f"bag = DagBag(dag_folder={str(DAGS)!r})\nassert not bag.import_errors, bag.import_errors\n"
        "print(sorted(m for m in ('pyspark.sql', 'great_expectations', 'psycopg', 'redis', "
        "'jobs.pipeline', 'jobs.spark', 'jobs.config', 'jobs.cli') if m in sys.modules))\n"
    )
    script = AIRFLOW_HOME / "parse_check.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"


@pytest.fixture
def dag_env(monkeypatch, sample_root, redis_server, pg_server, pg_db, redis_db, tmp_path):
    """Env and config the DAG tasks run with: the sample tables, the suite's Redis and PostgreSQL,
    and definitions holding only the (small) store source."""
    defs = tmp_path / "defs"
    defs.mkdir()
    for name in ("entities.yaml", "store_features_long.yaml"):
        (defs / name).write_text((ROOT / "feature_defs" / name).read_text())
    conf = env_conf(
        tmp_path / "conf",
        "ci",
        f"data_root: {sample_root}\ndefinitions_dir: {defs}\nreports_dir: {tmp_path / 'reports'}\nquarantine_root: {tmp_path / 'q'}\n"
        f"ledger_root: {tmp_path / 'ledger'}\nredis:\n  url: {redis_server.url}\n  sample_entities: 20\n"
        f"sql:\n  dsn: {pg_server.dsn}\n  password_env: null\nquality:\n  max_bad_fraction: 0.05\n  verify_sample: 1000\n",
    )
    env = {"FM_CONF_DIR": str(conf), "FM_ENV": "ci", "FM_DEFINITIONS_DIR": str(defs), "SPARK_LOCAL_IP": "127.0.0.1"}
    bag = load_dags(monkeypatch, **env)
    return bag, tmp_path


def test_nightly_dag_materializes_a_sample_date(spark, airflow_db, dag_env, sample_root, redis_db, pg_db):
    bag, tmp_path = dag_env
    dag = bag.dags["fm_nightly_nightly"]
    assert [t.task_id.split(".")[0] for t in dag.tasks] == ["store_features_long"] * 3
    # the run triggered on DAY2 + 1 at 02:00 materializes DAY2
    run = dag.test(logical_date=dt.datetime.combine(DAY2 + dt.timedelta(days=1), dt.time(2), tzinfo=dt.UTC))
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state

    # values read back raw, against the source rows taken here with pandas
    pdf = spark.read.format("delta").load(str(sample_root / "store_features_long")).where(f"ds = '{DAY2}'").toPandas()
    good = pdf[pdf["store_id"].notna() & ~pdf["store_id"].fillna("").str.contains(":")]
    latest = good.sort_values("event_ts").groupby(["store_id", "feature_name"]).tail(1)
    kinds = {
        "avg_prep_minutes_7d": "float",
        "acceptance_rate_7d": "float",
        "rating_avg_30d": "float",
        "open_hours_week": "int",
        "is_open_late": "bool",
    }
    checked = 0
    for _, r in latest[latest["feature_name"].isin(list(kinds))].iterrows():
        kind = kinds[r["feature_name"]]
        raw = redis_db.hget(f"s:{r['store_id']}", field_id(r["feature_name"]))
        want = {"float": float, "int": int, "bool": bool}[kind](r["value"])
        assert decode(kind, raw) == want, (r["store_id"], r["feature_name"])
        row = pg_db.execute("SELECT features->%s FROM store_features WHERE entity_key = %s", (r["feature_name"], r["store_id"])).fetchone()
        assert row[0] == want
        checked += 1
    assert checked > 200  # 60 sample stores x 5 features, less the nulls
    assert entity_count(redis_db) == good["store_id"].nunique()
    # one run gated (great-expectations' checks included) and read a sample back: its summary says both
    report = json.loads((tmp_path / "reports" / "store_features_long" / str(DAY2) / "summary.json").read_text())
    assert report["status"] == "succeeded"
    assert len(report["expectations"]) > 10 and all(e["success"] for e in report["expectations"])
    assert {store: (v["checked"], v["mismatches"]) for store, v in report["verification"].items()} == {
        "redis": (good["store_id"].nunique(), 0),
        "sql": (good["store_id"].nunique(), 0),
    }
    assert not (tmp_path / "reports" / "store_features_long" / str(DAY2) / "validation.json").exists()  # no validate task


def test_backfill_dag_params_reach_the_cli(spark, airflow_db, dag_env):
    bag, tmp_path = dag_env
    dag = bag.dags["fm_backfill"]
    params = {"source": "store_features_long", "start": str(DAY1), "end": str(DAY2), "mode": "latest", "sink": "redis", "force": False}
    run = dag.test(run_conf=params)
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state
    steps = Ledger(spark, tmp_path / "ledger").list("store_features_long")
    assert [(r["kind"], r["start_date"], r["end_date"], r["sinks"], r["status"]) for r in steps] == [
        ("backfill-latest", DAY1, DAY2, ["redis"], "succeeded")
    ]


def test_a_failed_quality_gate_fails_the_run_with_the_reason_in_the_log(spark, airflow_db, dag_env, redis_db, capfd):
    bag, tmp_path = dag_env
    conf = Path(os.environ["FM_CONF_DIR"]) / "ci" / "m.yaml"
    conf.write_text(
        conf.read_text().replace("max_bad_fraction: 0.05", "max_bad_fraction: 0.0001")
    )  # the sample's 2 bad rows are too many now
    # the materialize task on its own (the sensor is covered by the test above): its run's gate stops it before any write
    dag = bag.dags["fm_nightly_nightly"].partial_subset(task_ids=["store_features_long.materialize"], include_upstream=False)
    run = dag.test(logical_date=dt.datetime.combine(DAY2 + dt.timedelta(days=1), dt.time(2), tzinfo=dt.UTC))
    assert "failed" in str(run.state).lower()
    log = capfd.readouterr()
    log = log.out + log.err  # the materialize task's log
    assert "error: store_features_long: QualityGateError: source 'store_features_long' 2026-11-20" in log
    assert "2 of 414 rows are bad input (0.48% > quality.max_bad_fraction 0.01%)" in log
    assert "jobs/materialize.py exited with 4 (the data-quality gate failed): not retried" in log
    assert log.count("Spark-Submit cmd: ") == 1  # submitted once: failed fast, no retry
    assert redis_db.dbsize() == 0  # nothing written


@pytest.mark.parametrize(
    ("code", "attempts", "state"),
    [(7, 1, "failed"), (1, 2, "failed"), (3, 1, "skipped")],
    ids=["retry-cannot-fix", "transient", "no-rows-in-the-window"],
)
@pytest.mark.spark  # spark-submit starts a JVM for each attempt
def test_spark_submit_failures_are_retried_only_when_a_retry_can_help(airflow_db, monkeypatch, tmp_path, code, attempts, state):
    # the materialize task as the DAGs build it, spark-submit running a stand-in driver that
    # counts its starts and exits with `code` (spark-submit returns the driver's exit code)
    from jobs.exit_codes import RETRY_CANNOT_FIX

    assert (code in RETRY_CANNOT_FIX) == (code == 7)
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ['PATH']}")  # spark-submit of the venv
    bag = load_dags()
    limit = sys.getrecursionlimit()
    dag = bag.dags["fm_nightly_nightly"].partial_subset(task_ids=["consumer_daily.materialize"], include_upstream=False)
    sys.setrecursionlimit(limit)  # Airflow's operator copy raises it for the whole process (tests of deep JSON rely on it)
    counter = tmp_path / "starts"
    driver = tmp_path / "driver.py"
    driver.write_text(
        f"import pathlib, sys\np = pathlib.Path({str(counter)!r})\np.write_text(p.read_text() + 'x' if p.exists() else 'x')\n"
        f"sys.exit({code})\n"
    )
    task = dag.get_task("consumer_daily.materialize")
    task.application, task.application_args, task.jars, task.conf = str(driver), [], None, {}
    task.retries, task.retry_delay, task.retry_exponential_backoff = 1, dt.timedelta(0), False
    task.skip_not_ready = True  # as in fm_incremental: a window with no rows has nothing to load
    run = dag.test(logical_date=dt.datetime.combine(DAY2 + dt.timedelta(days=1), dt.time(2), tzinfo=dt.UTC))
    assert len(counter.read_text()) == attempts
    (ti,) = run.get_task_instances()
    assert str(ti.state).lower().endswith(state), ti.state


def test_incremental_dag_loads_an_event_time_source_on_its_own_schedule(spark, airflow_db, monkeypatch, tmp_path, redis_server, redis_db):

    rows = [
        (1, 0.5, "a", at("2026-11-20 08:00:00"), at("2026-11-20 08:00:00")),
        (1, 0.75, "b", at("2026-11-20 09:00:00"), at("2026-11-20 09:00:00")),
        (2, 1.5, "c", at("2026-11-20 07:00:00"), at("2026-11-20 07:00:00")),
    ]
    write_events(spark, tmp_path, rows, extra='  schedule: "@hourly"\n')
    conf = env_conf(
        tmp_path / "conf",
        "ci",
        f"data_root: {tmp_path}\ndefinitions_dir: {tmp_path / 'defs'}\nreports_dir: {tmp_path / 'reports'}\n"
        f"quarantine_root: {tmp_path / 'q'}\nledger_root: {tmp_path / 'ledger'}\nsinks: [redis]\n"
        f"redis:\n  url: {redis_server.url}\n  sample_entities: 20\nquality:\n  expectations: false\n",
    )
    env = {"FM_CONF_DIR": str(conf), "FM_ENV": "ci", "FM_DEFINITIONS_DIR": str(tmp_path / "defs"), "SPARK_LOCAL_IP": "127.0.0.1"}
    bag = load_dags(monkeypatch, **env)
    assert bag.import_errors == {}
    assert set(bag.dags) == {"fm_incremental_hourly", "fm_cleanup", "fm_backfill"}  # no source selects by date: no nightly DAG
    dag = bag.dags["fm_incremental_hourly"]
    assert dag.schedule == "@hourly"  # the source's own schedule
    (task,) = dag.tasks
    assert task.task_id == "events.materialize" and task.pool == POOL
    assert task.application_args == ["--env", "ci", "--incremental", "--source", "events"]
    run = dag.test(logical_date=dt.datetime(2026, 11, 21, 3, tzinfo=dt.UTC))
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state
    # each consumer's latest row by event time, as of that time, read back raw
    latest = {1: (0.75, "b", at("2026-11-20 09:00:00")), 2: (1.5, "c", at("2026-11-20 07:00:00"))}
    for consumer, (score, tag, when) in latest.items():
        assert redis_db.hgetall(f"c:{consumer}") == expected_hash(SPECS, {"score": score, "tag": tag}, FRESH, epoch(when)), consumer
    steps = Ledger(spark, tmp_path / "ledger").list("events")
    assert [(r["kind"], r["status"]) for r in steps] == [("run", "succeeded")]


def test_cleanup_dag_deletes_expired_sql_rows(spark, airflow_db, dag_env, pg_db, redis_db):
    from jobs.cli import main

    bag, tmp_path = dag_env
    assert main(["run", "--env", "ci", "--date", str(DAY2), "--source", "store_features_long"]) == 0
    keys = [k for (k,) in pg_db.execute("SELECT entity_key FROM store_features ORDER BY entity_key")]
    expired = keys[:3]
    pg_db.execute("UPDATE store_features SET expires_at = now() - interval '1 hour' WHERE entity_key = ANY(%s)", (expired,))
    redis_before = {k: redis_db.hgetall(k) for k in redis_db.scan_iter()}
    run = bag.dags["fm_cleanup"].test(logical_date=dt.datetime(2026, 11, 22, 5, tzinfo=dt.UTC))
    assert str(run.state) in ("success", "DagRunState.SUCCESS"), run.state
    left = [k for (k,) in pg_db.execute("SELECT entity_key FROM store_features ORDER BY entity_key")]
    assert left == keys[3:] and len(left) > 10
    assert {k: redis_db.hgetall(k) for k in redis_db.scan_iter()} == redis_before  # every feature is still defined
