"""Nightly materialization: one DAG per schedule group of the sources selected by date
(sources selected by event time run in fm_incremental_<group>).

The run triggered at 02:00 UTC on D+1 materializes D (Airflow 3 cron runs carry their
trigger time as logical date). For each source of the group: wait for D's ETL partition
(a sensor in reschedule mode; `materialize ready` reads the table's files, no JVM), then
materialize (spark-submit of jobs/materialize.py, in the Redis pool): one read of the
snapshot, gated (a failed gate fails the run before anything is written, not retried, with
the failed checks in the task log; in spark-submit's cluster deploy mode the exit code is not
known and every failure is retried), written, and a sample read back from the stores; then
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

        # the run gates the snapshot it read before writing (a failed gate: exit 4, not retried) and
        # reads a sample back: no validate or verify task reads and prepares it again
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

        @task(task_id="report", execution_timeout=dt.timedelta(minutes=5))
        def report(ds=None) -> None:
            cli_task("report", "--env", fm.ENV, "--date", _day_before(ds), "--source", source)

        wait_for_partition() >> materialize >> report()


def _day_before(ds: str) -> str:
    return (dt.date.fromisoformat(ds) - dt.timedelta(days=1)).isoformat()


for _group, _sources in fm.sources_by_group().items():
    _about = f"Materialize the {_group} sources ({', '.join(_sources)}) into the online stores"
    with DAG(**fm.group_dag("nightly", _group, _about, __doc__)) as _dag:
        for _source in _sources:
            _source_tasks(_source)
    globals()[_dag.dag_id] = _dag
