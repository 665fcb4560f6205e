"""On-demand backfill of one source: trigger with params (source, start, end, mode, ...).

Runs `materialize backfill` (see jobs/README.md): skipped dates, resume after a failure and
the run ledger all come from the CLI. In the Redis pool, so it never overlaps a nightly
upload to the same cluster.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param, task

from jobs import airflow_support as fm

_SOURCES = sorted(s for names in fm.sources_by_group().values() for s in names)

with DAG(
    dag_id="fm_backfill",
    description="Backfill one source over a range of dates (materialize backfill)",
    schedule=None,
    start_date=dt.datetime(2026, 11, 1, tzinfo=dt.UTC),
    catchup=False,
    max_active_runs=1,
    default_args={**fm.DEFAULT_ARGS, "retries": 1, "execution_timeout": dt.timedelta(hours=12)},
    tags=[*fm.TAGS, "backfill"],
    doc_md=__doc__,
    params={
        # no defaults: a trigger must name what to backfill
        "source": Param(enum=_SOURCES or [""], description="the source (ETL table)"),
        "start": Param(type="string", format="date", description="first date, YYYY-MM-DD"),
        "end": Param(type="string", format="date", description="last date, YYYY-MM-DD (not in the future)"),
        "mode": Param("latest", enum=["latest", "replay"], description="latest: one pass; replay: date by date"),
        "sink": Param("all", enum=["all", "redis", "cockroach"], description="store(s) to write"),
        "force": Param(False, type="boolean", description="write dates already written"),
    },
) as dag:

    @task.bash(task_id="backfill", env=fm.task_env(), append_env=True, pool=fm.REDIS_POOL)
    def backfill() -> str:
        return fm.materialize(
            "backfill", "--env", fm.ENV, "--source", "{{ params.source }}", "--start", "{{ params.start }}", "--end", "{{ params.end }}",
            "--mode", "{{ params.mode }}", "--sink", "{{ params.sink }}", "{{ '--force' if params.force else '' }}",
        )  # fmt: skip

    backfill()
