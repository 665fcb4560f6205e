#!/usr/bin/env bash
# Start/stop the local servers that the `local` env points at:
#   Redis      127.0.0.1:6390
#   PostgreSQL 127.0.0.1:6391, database "features" (the wire-compatible stand-in for CockroachDB)
# State lives in .run/ (git-ignored). Idempotent: start does nothing for a server that is up.
# PostgreSQL refuses to run as root, so as root its cluster is owned by the 'postgres' user.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RUN="$ROOT/.run"
PORT="${FM_LOCAL_REDIS_PORT:-6390}"
PG_PORT="${FM_LOCAL_PG_PORT:-6391}"
PG_DB=features
mkdir -p "$RUN"

pg_bin() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

as_pg() {  # run a PostgreSQL tool as the 'postgres' user when we are root
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_dir() {
  # The cluster lives in .run/pg unless (as root) the postgres user cannot reach it; then
  # in a fresh private temp dir, whose path is remembered in .run/pg.path.
  if [ -f "$RUN/pg.path" ]; then
    cat "$RUN/pg.path"
  elif [ "$(id -u)" -ne 0 ] || runuser -u postgres -- test -x "$RUN"; then
    echo "$RUN/pg"
  else
    mktemp -d /tmp/feature-materializer-pg.XXXXXX | tee "$RUN/pg.path"
  fi
}

pg_wait_ready() {  # pg_isready: 0 accepting, 1 starting up / rejecting, 2 no answer
  local bin=$1 rc
  for _ in $(seq 100); do
    rc=0; as_pg "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" || rc=$?
    [ "$rc" -eq 1 ] || return "$rc"
    sleep 0.1
  done
  return 1
}

start_redis() {
  if redis-cli -p "$PORT" ping >/dev/null 2>&1; then
    echo "[services] redis already up on 127.0.0.1:$PORT"
    return
  fi
  redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize yes \
    --maxmemory 512mb --maxmemory-policy noeviction --hash-max-listpack-value 256 \
    --pidfile "$RUN/redis.pid" --logfile "$RUN/redis.log" --dir "$RUN"
  for _ in $(seq 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  echo "[services] redis started on 127.0.0.1:$PORT (log: $RUN/redis.log)"
}

start_postgres() {
  local bin dir
  bin=$(pg_bin)
  [ -n "$bin" ] || { echo "[services] PostgreSQL is not installed: run 'make setup'" >&2; exit 1; }
  dir=$(pg_dir)
  if pg_wait_ready "$bin"; then
    echo "[services] postgresql already up on 127.0.0.1:$PG_PORT"
  else
    if [ ! -f "$dir/PG_VERSION" ]; then
      mkdir -p "$dir"
      if [ "$(id -u)" -eq 0 ]; then chown postgres:postgres "$dir"; fi
      chmod 700 "$dir"
      # trust on loopback only: a throwaway local server, never a deployment
      as_pg "$bin/initdb" -D "$dir" -A trust -U postgres -E UTF8 --locale=C.UTF-8 >/dev/null
    fi
    # The log stays inside the cluster dir: the postgres user can write there.
    # The socket dir is quoted for paths with spaces.
    as_pg "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w \
      -o "-p $PG_PORT -k '$dir' -c listen_addresses=127.0.0.1 -c max_connections=50" start >/dev/null
    echo "[services] postgresql started on 127.0.0.1:$PG_PORT (data and log: $dir)"
  fi
  if ! as_pg "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
    as_pg "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres "$PG_DB"
    echo "[services] created database $PG_DB"
  fi
}

stop_postgres() {
  local bin dir
  bin=$(pg_bin)
  dir=$(pg_dir)
  if [ -n "$bin" ] && as_pg test -f "$dir/postmaster.pid"; then
    as_pg "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null && echo "[services] postgresql stopped"
  else
    echo "[services] postgresql was not running"
  fi
}

case "${1:-start}" in
  start)
    start_redis
    start_postgres
    ;;
  stop)
    redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1 && echo "[services] redis stopped" || echo "[services] redis was not running"
    stop_postgres
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
