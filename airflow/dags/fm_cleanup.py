"""Cleanup: once a day, per entity type, `materialize cleanup` (jobs/README.md "Cleanup").

Deletes from Redis the fields of features no definition reads any more, and from the SQL
store the rows past their entity's TTL and those of removed sources (expired rows pile up
otherwise). In the Redis pool, so it never runs beside an upload. The SQL part needs a role
that may DELETE: set FM_CLEANUP_SQL_DSN (no password in it) and FM_CLEANUP_SQL_PASSWORD_ENV
(the name of the worker's env var holding its password) where the scheduler parses DAGs.
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, task

from jobs import airflow_support as fm
from jobs.airflow_tasks import cli_task

_SQL_ROLE = [
    arg
    for flag, var in (("--sql-dsn", "FM_CLEANUP_SQL_DSN"), ("--sql-password-env", "FM_CLEANUP_SQL_PASSWORD_ENV"))
    if os.environ.get(var)
    for arg in (flag, os.environ[var])
]

with DAG(
    dag_id="fm_cleanup",
    description="Delete what no definition reads any more, and expired SQL rows (materialize cleanup)",
    schedule=fm.CLEANUP_SCHEDULE,
    start_date=fm.START_DATE,
    catchup=False,
    max_active_runs=1,
    default_args=fm.DEFAULT_ARGS,
    tags=[*fm.TAGS, "cleanup"],
    doc_md=__doc__,
) as dag:
    for _entity in fm.entities():

        @task(task_id=f"cleanup_{_entity}", pool=fm.REDIS_POOL)
        def cleanup(entity: str = _entity) -> None:
            cli_task("cleanup", "--env", fm.ENV, "--entity", entity, *_SQL_ROLE)

        cleanup()
