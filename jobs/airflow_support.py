"""What the Airflow DAG files share; light on purpose (parsed by the scheduler often).

Only the standard library and PyYAML: no Spark, no network, no database. The only
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

PROJECT_DIR = Path(os.environ.get("FM_PROJECT_DIR") or Path(__file__).resolve().parent.parent)
BIN_DIR = Path(os.environ.get("FM_BIN_DIR") or PROJECT_DIR / ".venv" / "bin")
DEFINITIONS_DIR = Path(os.environ.get("FM_DEFINITIONS_DIR") or PROJECT_DIR / "feature_defs")
ENV = os.environ.get("FM_ENV", "local")
SPARK_CONN_ID = os.environ.get("FM_SPARK_CONN_ID", "fm_spark")
REDIS_POOL = os.environ.get("FM_REDIS_POOL", "fm_redis_writes")
"""Airflow pool (1 slot) of every task that writes to the Redis cluster: one heavy upload at a time."""
OWNER = "ml-platform"
TAGS = ["feature-materializer"]
DELTA_JARS = [PROJECT_DIR / "jars" / "delta-spark_4.2_2.13-4.4.0.jar", PROJECT_DIR / "jars" / "delta-storage-4.4.0.jar"]

# Schedule groups named in feature_defs and their cron; any other group name is used as
# the schedule itself (a preset like "@daily" or a cron expression).
SCHEDULES = {"nightly": "0 2 * * *", "hourly": "@hourly"}

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
    """Environment for the CLI and spark-submit: the venv first on PATH, its Python for the workers."""
    env = {k: v for k, v in os.environ.items() if k.startswith(("FM_", "AIRFLOW_CONN_"))}
    env["PATH"] = f"{BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = str(BIN_DIR / "python")
    env.setdefault("SPARK_LOCAL_IP", os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
    env["FM_ENV"] = ENV
    return env
