"""The job bundle's entry point: a driver that runs on the cluster (spark-submit --deploy-mode cluster).

``scripts/package.sh`` builds ``dist/feature_materializer-<version>-job.jar``, a zip that
holds everything the driver needs: this file as its ``__main__.py``, the project's packages
with ``feature_defs/`` and ``conf/`` (``project/``), the same packages zipped for the
executors (``project.zip``) and one Python environment for the driver and the executors
(``<name>-runtime.pex``: every third-party package the job imports, great-expectations
included, pyspark not: the cluster's Spark provides it). Python runs a zip by its
``__main__.py``, so ``python3.11 <bundle> run --env prod --date ...`` runs ``materialize
run`` (any command works: backfill, cleanup, doctor); Spark's ``PythonRunner`` does exactly
that on the node the cluster picked for the driver.

The name ends in ``.jar`` because spark-submit's standalone cluster mode accepts only a jar
as the application it copies to that node (and refuses Python applications outright), so
the job is submitted as ``--class org.apache.spark.deploy.PythonRunner <bundle>``.

Standard library only: it runs before any package is importable. It unpacks the bundle once
per content (``BUNDLE_ID``) under ``$FM_BUNDLE_ROOT`` (default: ``.fm-bundle`` in the
working directory, the driver's own folder on a worker) and replaces itself with the
runtime PEX running the ``materialize`` command line (``jobs.cli``), with the project
first on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import shutil
import sys
import zipfile

BUNDLE_DIR_VAR = "FM_BUNDLE_DIR"
"""Set for the job by this entry point: the unpacked bundle, which jobs.spark ships to the executors."""
BUNDLE_FILE_VAR = "FM_BUNDLE_FILE"
"""The bundle's file name: spark-submit lists it among the application's jars, which jobs.spark
takes it out of (the executors would each fetch it for nothing)."""
RUNTIME_SUFFIX = "-runtime.pex"
PROJECT_ZIP = "project.zip"


def unpack(bundle: str, root: str) -> str:
    """The bundle unpacked under ``root`` (once: a folder per BUNDLE_ID, written aside and renamed)."""
    with zipfile.ZipFile(bundle) as zf:
        bundle_id = zf.read("BUNDLE_ID").decode().strip()
        target = os.path.join(root, bundle_id)
        if os.path.isfile(os.path.join(target, "BUNDLE_ID")):
            return target
        os.makedirs(root, exist_ok=True)
        partial = f"{target}.{os.getpid()}.partial"
        zf.extractall(partial)
    for name in os.listdir(partial):
        if name.endswith(RUNTIME_SUFFIX):
            os.chmod(os.path.join(partial, name), 0o755)
    try:
        os.rename(partial, target)
    except OSError:  # another driver on this node unpacked the same bundle first
        shutil.rmtree(partial, ignore_errors=True)
    return target


def main() -> None:
    bundle = os.path.abspath(sys.argv[0])
    target = unpack(bundle, os.environ.get("FM_BUNDLE_ROOT") or os.path.abspath(".fm-bundle"))
    runtime = next(os.path.join(target, n) for n in sorted(os.listdir(target)) if n.endswith(RUNTIME_SUFFIX))
    project = os.path.join(target, "project")
    os.environ[BUNDLE_DIR_VAR] = target
    os.environ[BUNDLE_FILE_VAR] = os.path.basename(bundle)
    os.environ["FM_PROJECT_ROOT"] = project  # conf/ and feature_defs/ as packaged
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (project, os.environ.get("PYTHONPATH")) if p)
    # The executors run the same environment: jobs.spark sends them the PEX by this name.
    os.environ["PYSPARK_PYTHON"] = "./" + os.path.basename(runtime)
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, runtime, "-m", "jobs.cli", *sys.argv[1:]])


if __name__ == "__main__":
    main()
