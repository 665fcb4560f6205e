"""Nightly materialization: one DAG per schedule group of the sources selected by date
(sources selected by event time run in fm_incremental_<group>).

The run triggered at 02:00 UTC on D+1 materializes D (Airflow 3 cron runs carry their
trigger time as logical date). For each source of the group: wait for D's ETL partition
(a sensor in reschedule mode), validate (the data-quality gate; a failure fails the run,
not retried, with the failed checks in the task log), materialize (spark-submit of
jobs/materialize.py, in the Redis pool), verify (read a sample back from the stores) and
report (the run's summary in the log). To repair a past date after fixing its data, use
the fm_backfill DAG (replay): it applies the later dates again, so nothing ends older.

A task whose failure retrying cannot fix (bad input, a failed gate, definitions or changes
the stores refuse, a source table not as defined: jobs/exit_codes.py) fails at once, without
its retries; the others (a store or the catalog out of reach, a lease held) are retried.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, PokeReturnValue, TaskGroup, task

from jobs import airflow_support as fm
from jobs.airflow_tasks import MaterializeSubmit, check_exit, cli_task, run_cli


def _source_tasks(source: str) -> None:
    with TaskGroup(group_id=source):

        @task.sensor(task_id="wait_for_partition", mode="reschedule", poke_interval=600, timeout=8 * 3600)
        def wait_for_partition(logical_date=None) -> PokeReturnValue:
            day = (logical_date - dt.timedelta(days=1)).date().isoformat()
            done = run_cli("ready", "--env", fm.ENV, "--source", source, "--date", day)
            if done.returncode != fm.EXIT_NOT_READY:  # not ready: no rows yet; anything else is an error (a definition: not retried)
                check_exit(done.returncode, f"`materialize ready` of {source} {day}")
            return PokeReturnValue(is_done=done.returncode == fm.EXIT_OK)

        @task(task_id="validate")
        def validate(logical_date=None) -> None:
            # A failed gate is not retried: the same data fails again (the failed checks are in the log).
            # No rows now, after the sensor saw some: the partition is being rewritten (retried).
            day = (logical_date - dt.timedelta(days=1)).date().isoformat()
            cli_task("validate", "--env", fm.ENV, "--date", day, "--source", source)

        materialize = MaterializeSubmit(
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

        @task(task_id="verify")
        def verify(ds=None) -> None:
            cli_task("verify", "--env", fm.ENV, "--date", _day_before(ds), "--source", source)

        @task(task_id="report", execution_timeout=dt.timedelta(minutes=5))
        def report(ds=None) -> None:
            cli_task("report", "--env", fm.ENV, "--date", _day_before(ds), "--source", source)

        wait_for_partition() >> validate() >> materialize >> verify() >> report()


def _day_before(ds: str) -> str:
    return (dt.date.fromisoformat(ds) - dt.timedelta(days=1)).isoformat()


for _group, _sources in fm.sources_by_group().items():
    _about = f"Materialize the {_group} sources ({', '.join(_sources)}) into the online stores"
    with DAG(**fm.group_dag("nightly", _group, _about, __doc__)) as _dag:
        for _source in _sources:
            _source_tasks(_source)
    globals()[_dag.dag_id] = _dag
