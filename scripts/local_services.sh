#!/usr/bin/env bash
# Start/stop the local Redis that the `local` env points at (127.0.0.1:6390).
# State lives in .run/ (git-ignored). Idempotent: start does nothing when it is up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN="$ROOT/.run"
PORT="${FM_LOCAL_REDIS_PORT:-6390}"
mkdir -p "$RUN"

case "${1:-start}" in
  start)
    if redis-cli -p "$PORT" ping >/dev/null 2>&1; then
      echo "[services] redis already up on 127.0.0.1:$PORT"
    else
      redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
        --maxmemory 512mb --maxmemory-policy noeviction --hash-max-listpack-value 256 \
        --pidfile "$RUN/redis.pid" --logfile "$RUN/redis.log" --dir "$RUN"
      for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
      echo "[services] redis started on 127.0.0.1:$PORT (log: $RUN/redis.log)"
    fi
    ;;
  stop)
    redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 && echo "[services] redis stopped" || echo "[services] redis was not running"
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
