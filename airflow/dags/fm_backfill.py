"""On-demand backfill of one source: trigger with params (source, start, end, mode, ...).

Runs `materialize backfill` (see jobs/README.md): skipped dates, resume after a failure and
the run ledger all come from the CLI. In the Redis pool, so it never overlaps a nightly
upload to the same cluster. A failure retrying cannot fix (a failed gate, definitions) fails
at once; after any other, a retry resumes where the backfill stopped.
"""

from __future__ import annotations

import datetime as dt

from airflow.sdk import DAG, Param, task

from jobs import airflow_support as fm
from jobs.airflow_tasks import cli_task

_SOURCES = sorted(s for names in fm.sources_by_group().values() for s in names)

with DAG(
    dag_id="fm_backfill",
    description="Backfill one source over a range of dates (materialize backfill)",
    schedule=None,
    start_date=fm.START_DATE,
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
        "sink": Param("all", enum=["all", "redis", "sql", "cockroach"], description="store(s) to write (cockroach: the old name of sql)"),
        "force": Param(False, type="boolean", description="write dates already written"),
    },
) as dag:

    @task(task_id="backfill", pool=fm.REDIS_POOL)
    def backfill(params=None) -> None:
        p = params
        cli_task(
            "backfill", "--env", fm.ENV, "--source", p["source"], "--start", p["start"], "--end", p["end"],
            "--mode", p["mode"], "--sink", p["sink"], *(["--force"] if p["force"] else []),
        )  # fmt: skip

    backfill()
