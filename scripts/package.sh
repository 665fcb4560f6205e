#!/usr/bin/env bash
# `make package`: what a Spark cluster needs to run the job (sinks/README.md "Running on a Spark cluster").
#   dist/feature_materializer-<version>.zip              the project's packages, for --py-files
#   dist/feature_materializer-<version>-runtime.pex      the Python environment (PEX) of driver and executors:
#                                                        client mode's --files / spark.pyspark.python, and in the bundle
#   dist/feature_materializer-<version>-job.jar          the job bundle, for --deploy-mode cluster: the
#                                                        project, conf/ and the runtime PEX in one zip
#   dist/package.env                                     their paths, for `source` in scripts
# Built from the installed .venv (run scripts/setup.sh first): no network. Each artifact is
# rebuilt only when a hash of its inputs changed, so running this again is cheap.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${FM_VENV:-$ROOT/.venv}"
DIST="$ROOT/dist"
PY="$VENV/bin/python"

log() { printf '[package] %s\n' "$*"; }

[ -x "$PY" ] && [ -x "$VENV/bin/pex" ] || { echo "no $VENV with pex: run 'make setup' (scripts/setup.sh) first" >&2; exit 1; }
mkdir -p "$DIST"
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
ZIP="$DIST/feature_materializer-$VERSION.zip"
RUNTIME="$DIST/feature_materializer-$VERSION-runtime.pex"
BUNDLE="${FM_BUNDLE_OUT:-$DIST/feature_materializer-$VERSION-job.jar}"

# --- 1. the project's packages, for --py-files ------------------------------------------
# Deterministic: sorted entries, fixed timestamps and modes, so equal inputs give equal bytes.
"$PY" - "$ZIP" <<'EOF'
import hashlib, os, sys, time, tomllib, zipfile
from pathlib import Path

zip_path = Path(sys.argv[1])
LAYOUT = "3"  # bump when the selection or layout below changes: rebuilds the zip
# the wheel's top-level packages (pyproject.toml): not tests, bench or throwaway
PACKAGES = tuple(sorted({p.split(".")[0] for p in tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["packages"]}))
SUFFIXES = (".py", ".pyi", ".yaml", ".yml", ".proto", ".typed", ".lock")
files = sorted(
    p for pkg in PACKAGES for p in Path(pkg).rglob("*")
    if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts
)
assert all((Path(pkg) / "__init__.py") in files for pkg in PACKAGES), "a package lacks its __init__.py"
digest = hashlib.sha256(LAYOUT.encode())
for p in files:
    digest.update(str(p).encode() + b"\0" + p.read_bytes() + b"\0")
stamp = zip_path.parent / f".{zip_path.name}.inputs"
if zip_path.is_file() and stamp.is_file() and stamp.read_text() == digest.hexdigest():
    print(f"[package] {os.path.relpath(zip_path)} up to date")
    sys.exit(0)
start = time.perf_counter()
for old in zip_path.parent.glob("feature_materializer-*.zip"):
    old.unlink()
tmp = zip_path.with_suffix(".zip.tmp")
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zf:
    dirs = sorted({str(parent) for p in files for parent in p.parents if str(parent) != "."})
    for d in dirs:  # directory entries: some importers and tools look for them
        info = zipfile.ZipInfo(d + "/", date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = (0o40755 << 16) | 0x10
        zf.writestr(info, b"")
    for p in files:
        info = zipfile.ZipInfo(str(p), date_time=(1980, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(info, p.read_bytes(), compresslevel=9)
os.replace(tmp, zip_path)
# The zip alone must provide the packages (ahead of the editable install on sys.path).
sys.path.insert(0, str(zip_path))
import sinks.partition, sinks.redis.writer, sinks.sql.writer, jobs.transforms, jobs.operations.cleanup.redis, jobs.cli  # noqa: E401,F401
assert jobs.__file__.startswith(str(zip_path)), jobs.__file__
with zipfile.ZipFile(zip_path) as zf:
    assert "feature_defs/consumer_daily.yaml" in zf.namelist() and "serializers/features.proto" in zf.namelist()
stamp.write_text(digest.hexdigest())
print(f"[package] built {os.path.relpath(zip_path)}: {len(files)} files in {time.perf_counter() - start:.1f}s")
EOF

# --- 2. the Python environment: one PEX file ---------------------------------------------------
# requirements-executor.txt (what the executor-side code imports) and requirements-driver.txt
# (what a driver adds: great-expectations, ...): one environment for driver and executors, so
# the two never differ (an executor-only PEX saved 62 MiB per executor, for a second build of
# ~30 s and a second artifact). Resolved from the .venv's installed distributions
# (--venv-repository: no index, no network), which constraints.txt pinned. Options, measured
# on 2 cores (sinks/README.md "Running on a Spark cluster"):
#   --venv --non-hermetic-venv-scripts: on first boot the PEX unpacks itself into a venv
#     under PEX_ROOT (~/.cache/pex) and reuses it. The venv hides the node's site-packages
#     but keeps PYTHONPATH, where Spark puts its own pyspark.zip and py4j: pyspark is not
#     in the PEX, the cluster's Spark provides it (and so always matches the JVM side).
#   --sh-boot: boots through /bin/sh, which finds a python3.11 and execs the cached venv
#     directly (about 0.3 s instead of 0.45 s per start).
#   compressed (the default): slower to build than --no-compress, but 143 MiB to ship to
#     every executor instead of about 480 MB; the build is skipped when unchanged.
#   pre-installed wheels (the default): ~3 s more build than --no-pre-install-wheels, but
#     each node's first boot is faster.
PEX_OPTS=(--venv --non-hermetic-venv-scripts --sh-boot)

# every pin in requirements-executor.txt and requirements-driver.txt must be the one in constraints.txt
"$PY" - <<'EOF'
import re, sys
def pins(path):
    out = {}
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line:
            m = re.fullmatch(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?==(\S+)", line)
            if not m:
                sys.exit(f"{path}: not an exact pin: {line!r}")
            out[re.sub(r"[-_.]+", "-", m[1]).lower()] = m[3]
    return out
lock = pins("constraints.txt")
for path in ("requirements-executor.txt", "requirements-driver.txt"):
    bad = [f"{n}=={v} (constraints.txt: {lock.get(n, 'missing')})" for n, v in pins(path).items() if lock.get(n) != v]
    if bad:
        sys.exit(f"{path} differs from constraints.txt: " + ", ".join(bad))
EOF

L="$("$PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "python", "lib"))')"
SPARK_PYTHONPATH="$(ls "$L"/pyspark.zip "$L"/py4j-*-src.zip | paste -sd:)"  # what a cluster's Spark provides

# build_pex OUT SMOKE_TEST REQUIREMENT_FILE...: a PEX of those requirements, pyspark left out
# (delta-spark requires it), rebuilt only when they, the lock or the options changed;
# SMOKE_TEST runs in it with Spark's own pyspark on the path, as on a cluster node.
build_pex() {
  local out="$1" smoke="$2"; shift 2
  local reqs=() f inputs stamp start ms
  for f in "$@"; do reqs+=(-r "$f"); done
  inputs=$( { cat "$@" constraints.txt; echo "${PEX_OPTS[*]}"; "$PY" -VV; "$VENV/bin/pex" --version; } | sha256sum | cut -c1-16)
  stamp="$DIST/.$(basename "$out").inputs"
  if [ -f "$out" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ]; then
    log "dist/$(basename "$out") up to date"
    return
  fi
  log "building dist/$(basename "$out") from $VENV"
  start=$(date +%s%N)
  rm -f "$out" "$stamp"
  "$VENV/bin/pex" --venv-repository "$VENV" "${reqs[@]}" --exclude pyspark "${PEX_OPTS[@]}" -o "$out.tmp" >/dev/null
  mv "$out.tmp" "$out"
  PYTHONPATH="$SPARK_PYTHONPATH" "$out" -c "$smoke"
  echo "$inputs" > "$stamp"
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  log "built in $((ms / 1000)).$(printf '%03d' $((ms % 1000)) | cut -c1)s"
}

EXECUTOR_IMPORTS='import pyspark, pyarrow, numpy, redis, hiredis, psycopg, xxhash, snappy, google.protobuf, pydantic, yaml
assert "pyspark.zip" in pyspark.__file__, pyspark.__file__'
rm -f "$DIST"/feature_materializer-*-executor.pex "$DIST"/.feature_materializer-*-executor.pex.inputs  # an older layout's
build_pex "$RUNTIME" "$EXECUTOR_IMPORTS
import great_expectations, pandas, delta.tables, orjson, tqdm, prometheus_client" requirements-executor.txt requirements-driver.txt

# --- 3. the job bundle, for --deploy-mode cluster (jobs/cluster_bundle.py) ------------------
# A zip Python runs by its __main__.py: the runtime PEX (stored: it is compressed already),
# the project's packages with feature_defs/ and conf/ (FM_CONF_DIR, else conf/; secrets are
# never in it) unpacked by the driver, and the --py-files zip it sends the executors.
# FM_BUNDLE_OUT writes it elsewhere (the suite bundles its own conf).
"$PY" - "$BUNDLE" "$RUNTIME" "$ZIP" "${FM_CONF_DIR:-$ROOT/conf}" <<'EOF'
import hashlib, os, sys, time, tomllib, zipfile
from pathlib import Path

bundle, runtime, project_zip, conf = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
LAYOUT = "3"  # bump when the selection or layout below changes
PACKAGES = tuple(sorted({p.split(".")[0] for p in tomllib.loads(Path("pyproject.toml").read_text())["tool"]["setuptools"]["packages"]}))
SUFFIXES = (".py", ".pyi", ".yaml", ".yml", ".proto", ".typed", ".lock")
if not (conf / "base").is_dir():
    sys.exit(f"{conf}: not a conf folder (no base/ in it)")
files = [(p, str(p)) for pkg in PACKAGES for p in sorted(Path(pkg).rglob("*")) if p.is_file() and p.suffix in SUFFIXES and "__pycache__" not in p.parts]
files += [(p, "conf/" + str(p.relative_to(conf))) for p in sorted(conf.rglob("*")) if p.is_file() and not p.name.startswith(".")]
digest = hashlib.sha256(LAYOUT.encode() + (runtime.parent / f".{runtime.name}.inputs").read_bytes() + project_zip.read_bytes())
for p, name in files:
    digest.update(name.encode() + b"\0" + p.read_bytes() + b"\0")
bundle_id = digest.hexdigest()[:20]
if bundle.is_file():
    try:
        with zipfile.ZipFile(bundle) as zf:
            if zf.read("BUNDLE_ID").decode() == bundle_id:
                print(f"[package] {os.path.relpath(bundle)} up to date")
                sys.exit(0)
    except (KeyError, zipfile.BadZipFile):
        pass
start = time.perf_counter()
bundle.parent.mkdir(parents=True, exist_ok=True)
tmp = bundle.with_name(bundle.name + ".tmp")
stamp = (1980, 1, 1, 0, 0, 0)

def add(zf, name, data, mode=0o644, compress=zipfile.ZIP_DEFLATED):
    info = zipfile.ZipInfo(name, date_time=stamp)
    info.external_attr = (0o100000 | mode) << 16
    info.compress_type = compress
    zf.writestr(info, data)

with zipfile.ZipFile(tmp, "w") as zf:
    add(zf, "__main__.py", Path("jobs/cluster_bundle.py").read_bytes())
    add(zf, "BUNDLE_ID", bundle_id.encode())
    add(zf, "project.zip", project_zip.read_bytes(), compress=zipfile.ZIP_STORED)
    for p, name in files:
        add(zf, "project/" + name, p.read_bytes())
    with zf.open(zipfile.ZipInfo(runtime.name, date_time=stamp), "w", force_zip64=True) as out, runtime.open("rb") as src:
        while chunk := src.read(1 << 22):
            out.write(chunk)
os.replace(tmp, bundle)
print(f"[package] built {os.path.relpath(bundle)}: {len(files)} files + the runtime in {time.perf_counter() - start:.1f}s")
EOF

cat > "$DIST/package.env" <<EOF
# written by scripts/package.sh: source it to get the artifacts' paths
FM_PY_FILES=$ZIP
FM_RUNTIME_PEX=$RUNTIME
FM_JOB_BUNDLE=$BUNDLE
EOF

DELTA_JARS=$("$PY" -m jobs.jars --jars jars)
size() { numfmt --to=iec-i --suffix=B "$(stat -c %s "$1")"; }
log "dist/$(basename "$ZIP")  $(size "$ZIP")  the project's packages (--py-files)"
log "dist/$(basename "$RUNTIME")  $(size "$RUNTIME")  the Python 3.11 environment of driver and executors (no pyspark, no project code)"
log "$(realpath --relative-to="$ROOT" "$BUNDLE")  $(size "$BUNDLE")  the job bundle: the project, conf and one environment for driver and executors"
cat <<EOF
[package] spark-submit, client mode, from this checkout (sinks/README.md "Running on a Spark cluster"). With --py-files
[package] the driver imports the project from the zip too; it then finds conf/ and feature_defs/ in the
[package] working directory (or FM_PROJECT_ROOT).
  .venv/bin/spark-submit --master spark://HOST:7077 \\
    --py-files dist/$(basename "$ZIP") \\
    --files dist/$(basename "$RUNTIME") \\
    --conf spark.pyspark.python=./$(basename "$RUNTIME") \\
    --conf spark.pyspark.driver.python=\$PWD/.venv/bin/python \\
    --jars $DELTA_JARS \\
    jobs/materialize.py --env ENV --date YYYY-MM-DD
[package] cluster mode: the driver runs on a worker from the bundle alone (sinks/README.md "Cluster deploy mode");
[package] scripts/submit-cluster.sh is spark-submit exiting 1 when the driver failed (spark-submit itself exits 0).
  scripts/submit-cluster.sh --master spark://HOST:7077 --deploy-mode cluster \\
    --class org.apache.spark.deploy.PythonRunner \\
    --conf spark.pyspark.driver.python=python3.11 \\
    --conf spark.standalone.submit.waitAppCompletion=true \\
    --jars $DELTA_JARS \\
    $(realpath --relative-to="$ROOT" "$BUNDLE") $(basename "$BUNDLE") "" run --env ENV --date YYYY-MM-DD
EOF
