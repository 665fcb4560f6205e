#!/usr/bin/env bash
# Idempotent set-up for a fresh Debian/Ubuntu machine (root, or a user with sudo).
# Installs what is missing: Java 17, redis-server, PostgreSQL, Maven (only to fetch the
# jars), a .venv with the pinned Python packages, the two Delta jars and the S3A connector's
# jars (jars/s3a). With --test, also the S3-compatible test server (moto) in .run/moto-venv,
# Feast in .run/feast-venv (throwaway/feast_venv.py), and Debian's prometheus (promtool) and
# prometheus-pushgateway (the monitoring tests; their services are not started); --test-fast
# only those two.
# Every step is skipped when its result is already there, so running it again is cheap.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${FM_VENV:-$ROOT/.venv}"
JARS="$ROOT/jars"
# The Delta version and jars come from jobs/jars.py (standard library only): `python -m jobs.jars`,
# with the system python3 before the venv exists and the venv's after.
HADOOP_VERSION=3.5.0  # pyspark's own Hadoop (its hadoop-client-api jar): hadoop-aws must match it
WITH_TEST_TOOLS=0  # --test: everything the whole suite uses
WITH_TEST_PACKAGES=0  # --test-fast: only the OS packages the tests without Spark use
[ "${1:-}" = "--test" ] && WITH_TEST_TOOLS=1 && WITH_TEST_PACKAGES=1
[ "${1:-}" = "--test-fast" ] && WITH_TEST_PACKAGES=1

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
# (no python3 yet on a bare machine: then no jars either)
command -v mvn >/dev/null 2>&1 || { command -v python3 >/dev/null 2>&1 && [ -f "$JARS/.complete-$(python3 -m jobs.jars --version)" ] && [ -f "$JARS/s3a/.complete-$HADOOP_VERSION" ]; } || missing+=(maven)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
if [ "$WITH_TEST_PACKAGES" = 1 ]; then  # the alert rules' checks (promtool) and the job's metrics (a Pushgateway)
  command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
  command -v prometheus-pushgateway >/dev/null 2>&1 || missing+=(prometheus-pushgateway)
fi

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
DELTA_VERSION=$("$VENV/bin/python" -m jobs.jars --version)
DELTA_ARTIFACTS=$("$VENV/bin/python" -m jobs.jars --artifacts)  # Maven coordinates, space-separated
if [ ! -f "$JARS/.complete-$DELTA_VERSION" ]; then
  log "fetching Delta $DELTA_VERSION jars with Maven"
  mkdir -p "$JARS"
  for a in $DELTA_ARTIFACTS; do
    mvn -q -B -C dependency:copy -Dartifact="$a" -DoutputDirectory="$JARS"  # -C: a checksum mismatch fails
  done
  touch "$JARS/.complete-$DELTA_VERSION"
else
  log "Delta jars present ($JARS)"
fi
# --- S3A: hadoop-aws of pyspark's Hadoop and the AWS SDK v2 modules it calls (14 MB, not
# the SDK's 686 MB bundle); what pyspark already has (Netty, SLF4J, HTTP client) is left out.
if [ ! -f "$JARS/s3a/.complete-$HADOOP_VERSION" ]; then
  found=$(ls "$VENV"/lib/python3*/site-packages/pyspark/jars/hadoop-client-api-*.jar 2>/dev/null | sed 's/.*hadoop-client-api-\(.*\)\.jar/\1/')
  [ "$found" = "$HADOOP_VERSION" ] || { echo "[setup] pyspark's Hadoop is $found, scripts/s3a/pom.xml pins $HADOOP_VERSION: update both" >&2; exit 1; }
  log "fetching the S3A connector's jars (hadoop-aws $HADOOP_VERSION) with Maven"
  rm -rf "$JARS/s3a"
  mvn -q -B -C -f scripts/s3a/pom.xml dependency:copy-dependencies -DoutputDirectory="$JARS/s3a" -DincludeScope=runtime \
    -DexcludeGroupIds=io.netty,org.slf4j -DexcludeArtifactIds=commons-codec,commons-logging,httpclient,httpcore
  touch "$JARS/s3a/.complete-$HADOOP_VERSION"
else
  log "S3A jars present ($JARS/s3a)"
fi

# --- the JVM class archive every job's driver starts from (jobs/class_archive.py): made
# once per JDK and Spark classpath, by a small job (about 75 s); about 5 s off each driver's start and first query.
"$VENV/bin/python" -m jobs.class_archive

# --- test tools: an S3-compatible server for the suite (its own venv: its Flask stack stays
# out of the product's) ------------------------------------------------------------------
if [ "$WITH_TEST_TOOLS" = 1 ]; then
  MOTO="$ROOT/.run/moto-venv"
  moto_stamp="$MOTO/.installed-$(sha256sum scripts/s3a/moto-requirements.txt | cut -c1-16)"
  if [ ! -f "$moto_stamp" ]; then
    log "installing the S3 test server (moto) into $MOTO"
    mkdir -p "$ROOT/.run"
    [ -x "$MOTO/bin/python" ] || python3 -m venv "$MOTO"
    "$MOTO/bin/python" -m pip install -q --disable-pip-version-check -r scripts/s3a/moto-requirements.txt
    rm -f "$MOTO"/.installed-*
    touch "$moto_stamp"
  else
    log "S3 test server present ($MOTO)"
  fi
  # Feast (pinned in scripts/feast/feast-requirements.txt) for the import and side-by-side tests:
  # made here so that no test pays for the install
  if "$VENV/bin/python" -c 'import sys; from throwaway import feast_venv; sys.exit(not feast_venv.installed())'; then
    log "Feast present ($ROOT/.run/feast-venv)"
  else
    "$VENV/bin/python" -m throwaway.feast_venv
  fi
fi
log "ready"
