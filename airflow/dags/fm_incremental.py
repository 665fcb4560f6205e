"""Incremental runs: one DAG per schedule group of the sources selected by event time.

Each run of a source loads the rows whose event time is past the last window the ledger
recorded (less the source's ``lookback_seconds``, for late rows) up to the moment it
starts: `materialize run --incremental` (jobs/README.md "Incremental runs"). A window with
no rows skips the task (nothing to load). A schedule group names its cron in
jobs/airflow_support.py (nightly: 02:00 UTC); any other group is the schedule itself, e.g.
``schedule: "@hourly"`` in a source's definition. Failures that retrying cannot fix fail
the task at once; the others are retried (as in fm_nightly).
"""

from __future__ import annotations

from airflow.sdk import DAG

from jobs import airflow_support as fm
from jobs.airflow_tasks import MaterializeSubmit

for _group, _sources in fm.sources_by_group(select_by="event_time").items():
    _about = f"Load what arrived since the last window of {', '.join(_sources)} into the online stores"
    with DAG(**fm.group_dag("incremental", _group, _about, __doc__)) as _dag:
        for _source in _sources:
            MaterializeSubmit(
                task_id=f"{_source}.materialize",
                conn_id=fm.SPARK_CONN_ID,
                application=str(fm.PROJECT_DIR / "jobs" / "materialize.py"),
                application_args=["--env", fm.ENV, "--incremental", "--source", _source],
                jars=",".join(str(j) for j in fm.DELTA_JARS),
                conf=fm.SPARK_CONF,
                env_vars=fm.task_env(),
                name=f"materialize-{_source}",
                pool=fm.REDIS_POOL,
                skip_not_ready=True,
            )
    globals()[_dag.dag_id] = _dag
