"""Nightly materialization: one DAG per schedule group declared in feature_defs.

The run triggered at 02:00 UTC on D+1 materializes D (Airflow 3 cron runs carry their
trigger time as logical date). For each source of the group: wait for D's ETL partition
(a sensor in reschedule mode), validate (the data-quality gate; a failure fails the run,
not retried, with the failed checks in the task log), materialize (spark-submit of
jobs/materialize.py, in the Redis pool), verify (read a sample back from the stores) and
report (the run's summary in the log). To repair a past date after fixing its data, use
the fm_backfill DAG (replay): it applies the later dates again, so nothing ends older.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, PokeReturnValue, TaskGroup, task
from airflow.sdk.exceptions import AirflowFailException

from jobs import airflow_support as fm


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    """The project's CLI in the worker's environment (plus FM_ENV, the venv on PATH), output to the task log."""
    done = subprocess.run(
        [str(fm.BIN_DIR / "materialize"), *args], env={**os.environ, **fm.task_env()}, capture_output=True, text=True, timeout=3 * 3600
    )
    print(done.stdout[-20000:])
    print(done.stderr[-20000:], file=sys.stderr)
    return done


def _source_tasks(source: str) -> None:
    with TaskGroup(group_id=source):

        @task.sensor(task_id="wait_for_partition", mode="reschedule", poke_interval=600, timeout=8 * 3600)
        def wait_for_partition(logical_date=None) -> PokeReturnValue:
            day = (logical_date - dt.timedelta(days=1)).date().isoformat()
            done = _run_cli("ready", "--env", fm.ENV, "--source", source, "--date", day)
            if done.returncode not in (fm.EXIT_OK, fm.EXIT_NOT_READY):  # not ready: no rows yet; anything else is an error
                raise RuntimeError(f"`materialize ready` failed with exit code {done.returncode}")
            return PokeReturnValue(is_done=done.returncode == fm.EXIT_OK)

        @task(task_id="validate")
        def validate(logical_date=None) -> None:
            day = (logical_date - dt.timedelta(days=1)).date().isoformat()
            done = _run_cli("validate", "--env", fm.ENV, "--date", day, "--source", source)
            if done.returncode == fm.EXIT_GATE_FAILED:
                # Not retried: the same data fails again. The failed checks are in the log above.
                raise AirflowFailException(f"the data-quality gate failed for {source} {day}; nothing was written (see the log)")
            if done.returncode == fm.EXIT_NOT_READY:
                # The sensor saw rows and now there are none: the partition is being rewritten. Retried.
                raise RuntimeError(f"{source} has no rows for {day} (not ready, exit code 3); nothing was written (retried)")
            if done.returncode:
                raise RuntimeError(f"`materialize validate` failed with exit code {done.returncode} (retried)")

        materialize = SparkSubmitOperator(
            task_id="materialize",
            conn_id=fm.SPARK_CONN_ID,
            application=str(fm.PROJECT_DIR / "jobs" / "materialize.py"),
            application_args=["--env", fm.ENV, "--date", fm.SNAPSHOT_DATE, "--source", source],
            jars=",".join(str(j) for j in fm.DELTA_JARS),
            conf=fm.SPARK_CONF,
            env_vars=fm.task_env(),
            name=f"materialize-{source}",
            pool=fm.REDIS_POOL,
        )

        @task.bash(task_id="verify", env=fm.task_env(), append_env=True)
        def verify() -> str:
            return fm.materialize("verify", "--env", fm.ENV, "--date", fm.SNAPSHOT_DATE, "--source", source)

        @task.bash(task_id="report", env=fm.task_env(), append_env=True, execution_timeout=dt.timedelta(minutes=5))
        def report() -> str:
            return fm.materialize("report", "--env", fm.ENV, "--date", fm.SNAPSHOT_DATE, "--source", source)

        wait_for_partition() >> validate() >> materialize >> verify() >> report()


for _group, _sources in fm.sources_by_group().items():
    with DAG(
        dag_id=f"fm_nightly_{_group}",
        description=f"Materialize the {_group} sources ({', '.join(_sources)}) into the online stores",
        schedule=fm.cron_for(_group),
        start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
        catchup=False,
        max_active_runs=1,
        default_args=fm.DEFAULT_ARGS,
        tags=[*fm.TAGS, "nightly", _group],
        doc_md=__doc__,
    ) as _dag:
        for _source in _sources:
            _source_tasks(_source)
    globals()[_dag.dag_id] = _dag
