#!/usr/bin/env bash
# Airflow against the local env, with the project's .venv: `scripts/airflow_local.sh <airflow args>`.
# Home in .run/airflow (SQLite), DAGs from airflow/dags, the Spark connection on local[2],
# and the Redis pool created. Examples:
#   scripts/airflow_local.sh dags test fm_nightly_nightly 2026-11-20
#   scripts/airflow_local.sh dags test fm_backfill --conf '{"source": "store_features_long", "start": "2026-11-18", "end": "2026-11-20"}'
#   scripts/airflow_local.sh standalone        # web UI on http://localhost:8080
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export AIRFLOW_HOME="${AIRFLOW_HOME:-$ROOT/.run/airflow}"
export AIRFLOW__CORE__DAGS_FOLDER="$ROOT/airflow/dags"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW_CONN_FM_SPARK="${AIRFLOW_CONN_FM_SPARK:-{\"conn_type\": \"spark\", \"host\": \"local[2]\"}}"
export FM_ENV="${FM_ENV:-local}" SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
AIRFLOW="$ROOT/.venv/bin/airflow"
mkdir -p "$AIRFLOW_HOME"
if [ ! -f "$AIRFLOW_HOME/.migrated" ]; then
  "$AIRFLOW" db migrate >/dev/null
  "$AIRFLOW" pools set fm_redis_writes 1 "one heavy upload to the Redis cluster at a time" >/dev/null
  touch "$AIRFLOW_HOME/.migrated"
fi
exec "$AIRFLOW" "$@"
