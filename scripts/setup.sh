#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian/Ubuntu machine (root, or a user with sudo).
# Installs what is missing: Java 17, redis-server, PostgreSQL, Maven (only to fetch the
# Delta jars), a .venv with the pinned Python packages, and the two Delta jars.
# Every step is skipped when its result is already there, so running it again is cheap.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${FM_VENV:-$ROOT/.venv}"
JARS="$ROOT/jars"
DELTA_VERSION=4.4.0
DELTA_ARTIFACTS=("io.delta:delta-spark_4.2_2.13:$DELTA_VERSION" "io.delta:delta-storage:$DELTA_VERSION")

log() { printf '[setup] %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# --- OS packages -----------------------------------------------------------------------
missing=()
java_major() { java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ]; then missing+=(openjdk-17-jre-headless); fi
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
command -v mvn >/dev/null 2>&1 || [ -f "$JARS/.complete-$DELTA_VERSION" ] || missing+=(maven)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)

if [ ${#missing[@]} -gt 0 ]; then
  log "installing OS packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -q
  as_root apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# Debian's package starts a system-wide redis on :6379; we never use it, our servers run on
# their own ports, so leave it alone rather than fight the init system.

python3 - <<'EOF'
import sys
if sys.version_info[:2] < (3, 11):
    sys.exit(f"feature-materializer needs Python >= 3.11, found {sys.version.split()[0]}")
EOF

# --- Python venv ---------------------------------------------------------------------------
stamp_src=$(cat requirements.txt constraints.txt pyproject.toml | sha256sum | cut -c1-16)
stamp="$VENV/.installed-$stamp_src"
if [ ! -f "$stamp" ]; then
  log "creating $VENV and installing pinned Python packages (about a minute on a fresh machine)"
  [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -c constraints.txt -r requirements.txt
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -e .
  rm -f "$VENV"/.installed-*
  touch "$stamp"
else
  log "Python packages up to date ($VENV)"
fi

# --- Delta jars (no Ivy download at run time) -------------------------------------------
if [ ! -f "$JARS/.complete-$DELTA_VERSION" ]; then
  log "fetching Delta $DELTA_VERSION jars with Maven"
  mkdir -p "$JARS"
  for a in "${DELTA_ARTIFACTS[@]}"; do
    mvn -q -B dependency:copy -Dartifact="$a" -DoutputDirectory="$JARS"
  done
  touch "$JARS/.complete-$DELTA_VERSION"
else
  log "Delta jars present ($JARS)"
fi
log "ready"
