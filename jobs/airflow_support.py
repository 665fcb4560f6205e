"""What the Airflow DAG files share; light on purpose (parsed by the scheduler often).

Only the standard library, PyYAML and the stdlib-only jobs/exit_codes.py and jobs/jars.py:
no Spark, no network, no database. The only
parse-time work is reading the small YAML files of ``feature_defs`` to learn the sources
and their schedule groups. Everything else happens when a task runs, through the
``materialize`` CLI of the project's virtualenv.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from functools import cache
from pathlib import Path

import yaml

from jobs import jars as delta_jars
from jobs.exit_codes import EXIT_GATE_FAILED, EXIT_NOT_READY, EXIT_OK  # noqa: F401  (the DAG files read them from here)

PROJECT_DIR = Path(os.environ.get("FM_PROJECT_DIR") or Path(__file__).resolve().parent.parent)
BIN_DIR = Path(os.environ.get("FM_BIN_DIR") or PROJECT_DIR / ".venv" / "bin")
DEFINITIONS_DIR = Path(os.environ.get("FM_DEFINITIONS_DIR") or PROJECT_DIR / "feature_defs")
ENV = os.environ.get("FM_ENV", "local")
SPARK_CONN_ID = os.environ.get("FM_SPARK_CONN_ID", "fm_spark")
REDIS_POOL = os.environ.get("FM_REDIS_POOL", "fm_redis_writes")
"""Airflow pool (1 slot) of every task that writes to the Redis cluster: one heavy upload at a time."""
OWNER = "ml-platform"
TAGS = ["feature-materializer"]
DELTA_JARS = [PROJECT_DIR / "jars" / name for name in delta_jars.DELTA_JARS]
SPARK_CONF = {
    # as jobs/spark.py's HUGE_METHODS gives local runs: Spark's generated code for a
    # 50-feature snapshot passes HotSpot's size limit for JIT compilation (the checks and
    # the gate ran 2-6x slower interpreted; sinks/README.md)
    "spark.driver.extraJavaOptions": "-XX:-DontCompileHugeMethods",
    "spark.executor.extraJavaOptions": "-XX:-DontCompileHugeMethods",
}
"""What the materialize task's spark-submit adds to the connection's settings."""

# Schedule groups named in feature_defs and their cron; any other group name is used as
# the schedule itself (a preset like "@hourly" or a cron expression).
SCHEDULES = {"nightly": "0 2 * * *"}
CLEANUP_SCHEDULE = os.environ.get("FM_CLEANUP_SCHEDULE", "0 5 * * *")
"""The cleanup DAG's: after the nightly uploads (it shares their Redis pool, so never beside one)."""

# Airflow 3 cron schedules trigger at the cron time and make that the logical date: the
# 02:00 run on D+1 has ds = D+1 and materializes D, the day that just ended.
SNAPSHOT_DATE = "{{ macros.ds_add(ds, -1) }}"

DEFAULT_ARGS = {
    "owner": OWNER,
    "retries": 2,
    "retry_delay": dt.timedelta(minutes=5),
    "retry_exponential_backoff": True,
    "max_retry_delay": dt.timedelta(hours=1),
    "execution_timeout": dt.timedelta(hours=3),
}


@cache
def _definitions(definitions_dir: Path) -> tuple[list[tuple[str, str, str]], list[str]]:
    """([(source, schedule group, select_by)], [entity names]) from the definition files (sorted, stable)."""
    sources, entities = [], []
    for path in sorted(definitions_dir.glob("*.y*ml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            continue
        source = data.get("source")
        if isinstance(source, dict) and source.get("name"):
            sources.append((str(source["name"]), str(source.get("schedule", "nightly")), str(source.get("select_by", "date"))))
        entities += [str(e["name"]) for e in data.get("entities") or [] if isinstance(e, dict) and e.get("name")]
    return sorted(sources), sorted(set(entities))


def sources_by_group(definitions_dir: Path = DEFINITIONS_DIR, select_by: str = "date") -> dict[str, list[str]]:
    """{schedule group: [source names]} of the sources selected by ``select_by`` (date: the
    nightly DAGs; event_time: the incremental ones)."""
    groups: dict[str, list[str]] = {}
    for name, group, selected_by in _definitions(definitions_dir)[0]:
        if selected_by == select_by:
            groups.setdefault(group, []).append(name)
    return dict(sorted(groups.items()))


def entities(definitions_dir: Path = DEFINITIONS_DIR) -> list[str]:
    """The entity types defined (the cleanup DAG's tasks)."""
    return _definitions(definitions_dir)[1]


def cron_for(group: str) -> str:
    return SCHEDULES.get(group, group)


START_DATE = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)


def group_dag(kind: str, group: str, description: str, doc: str) -> dict:
    """The settings of the DAG of one schedule group (``DAG(**group_dag(...))``): its id
    fm_<kind>_<group>, its schedule, and the policy every DAG here follows."""
    return {
        "dag_id": f"fm_{kind}_{dag_suffix(group)}", "description": description, "schedule": cron_for(group),
        "start_date": START_DATE, "catchup": False, "max_active_runs": 1, "default_args": DEFAULT_ARGS,
        "tags": [*TAGS, kind, group], "doc_md": doc,
    }  # fmt: skip


def dag_suffix(group: str) -> str:
    """A schedule group as a DAG id's end: "@hourly" -> "hourly", "*/15 * * * *" -> "15"."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", group).strip("_") or "schedule"


def materialize(*args: str) -> str:
    """A shell command running the project's CLI (templated args pass through as they are)."""
    return " ".join([str(BIN_DIR / "materialize"), *args])


def task_env() -> dict[str, str]:
    """What the tasks add to the worker's environment (which they keep): the config env,
    and the venv first on PATH (spark-submit is looked up there). Never secrets: they
    stay in the worker's environment, out of the serialized DAG."""
    return {"FM_ENV": ENV, "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
