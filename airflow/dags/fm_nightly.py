"""Nightly materialization: one DAG per schedule group declared in feature_defs.

For each source of the group: wait for the date's ETL partition (a sensor in reschedule
mode), validate (the data-quality gate; a failure fails the run with the failed checks
in the task log), materialize (spark-submit of jobs/materialize.py, in the Redis pool),
verify (read a sample back from the stores) and report (the run's summary in the log).
"""

from __future__ import annotations

import datetime as dt
import subprocess

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG, PokeReturnValue, TaskGroup, task

from jobs import airflow_support as fm


def _source_tasks(source: str) -> None:
    with TaskGroup(group_id=source):

        @task.sensor(task_id="wait_for_partition", mode="reschedule", poke_interval=600, timeout=8 * 3600)
        def wait_for_partition(ds: str | None = None) -> PokeReturnValue:
            cmd = [str(fm.BIN_DIR / "materialize"), "ready", "--env", fm.ENV, "--source", source, "--date", ds]
            done = subprocess.run(cmd, env=fm.task_env(), capture_output=True, text=True, timeout=900)
            print(done.stdout.strip() or done.stderr.strip()[-2000:])
            if done.returncode not in (0, 3):  # 3: no rows yet; anything else is an error
                raise RuntimeError(f"`materialize ready` failed with exit code {done.returncode}: {done.stderr[-2000:]}")
            return PokeReturnValue(is_done=done.returncode == 0)

        # Not retried: the same data fails the gate again. Fix the data, then clear the task.
        @task.bash(task_id="validate", env=fm.task_env(), append_env=False, retries=0)
        def validate() -> str:
            return fm.materialize("validate", "--env", fm.ENV, "--date", "{{ ds }}", "--source", source)

        materialize = SparkSubmitOperator(
            task_id="materialize",
            conn_id=fm.SPARK_CONN_ID,
            application=str(fm.PROJECT_DIR / "jobs" / "materialize.py"),
            application_args=["--env", fm.ENV, "--date", "{{ ds }}", "--source", source],
            jars=",".join(str(j) for j in fm.DELTA_JARS),
            env_vars=fm.task_env(),
            name=f"materialize-{source}",
            pool=fm.REDIS_POOL,
        )

        @task.bash(task_id="verify", env=fm.task_env(), append_env=False)
        def verify() -> str:
            return fm.materialize("verify", "--env", fm.ENV, "--date", "{{ ds }}", "--source", source)

        @task.bash(task_id="report", env=fm.task_env(), append_env=False, execution_timeout=dt.timedelta(minutes=5))
        def report() -> str:
            return fm.materialize("report", "--env", fm.ENV, "--date", "{{ ds }}", "--source", source)

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
