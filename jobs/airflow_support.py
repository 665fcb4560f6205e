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
# the schedule itself (a preset like "@daily" or a cron expression).
SCHEDULES = {"nightly": "0 2 * * *"}

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
def sources_by_group(definitions_dir: Path = DEFINITIONS_DIR) -> dict[str, list[str]]:
    """{schedule group: [source names]} from the definition files (sorted, stable)."""
    groups: dict[str, list[str]] = {}
    for path in sorted(definitions_dir.glob("*.y*ml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        source = data.get("source") if isinstance(data, dict) else None
        if isinstance(source, dict) and source.get("name"):
            groups.setdefault(str(source.get("schedule", "nightly")), []).append(str(source["name"]))
    return {group: sorted(names) for group, names in sorted(groups.items())}


def cron_for(group: str) -> str:
    return SCHEDULES.get(group, group)


def materialize(*args: str) -> str:
    """A shell command running the project's CLI (templated args pass through as they are)."""
    return " ".join([str(BIN_DIR / "materialize"), *args])


def task_env() -> dict[str, str]:
    """What the tasks add to the worker's environment (which they keep): the config env,
    and the venv first on PATH (spark-submit is looked up there). Never secrets: they
    stay in the worker's environment, out of the serialized DAG."""
    return {"FM_ENV": ENV, "PATH": f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"}
