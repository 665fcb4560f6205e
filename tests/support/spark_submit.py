"""spark-submit in cluster mode, as sinks/README.md documents it for a standalone cluster."""

from __future__ import annotations

from pathlib import Path

from jobs import jars as delta_jars

from .cli import ROOT

DELTA_JARS = [ROOT / "jars" / name for name in delta_jars.DELTA_JARS]
PYTHON_RUNNER = "org.apache.spark.deploy.PythonRunner"


def cluster_mode_args(master: str, bundle: Path, job_args: list[str], sizing: list[str]) -> list[str]:
    """spark-submit's arguments for the driver on the cluster, as sinks/README.md documents them
    for standalone (``sizing``: memory, cores and JVM options, which the docs leave to the cluster)."""
    return [
        "--master", master, "--deploy-mode", "cluster",
        "--class", PYTHON_RUNNER,  # standalone refuses Python applications in cluster mode; a jar is accepted
        "--conf", "spark.pyspark.driver.python=python3.11",
        "--conf", "spark.standalone.submit.waitAppCompletion=true",
        "--jars", ",".join(map(str, DELTA_JARS)),
        *sizing,
        str(bundle), bundle.name, "",  # PythonRunner: the file Python runs (its copy in the driver's folder), no --py-files
        *job_args,
    ]  # fmt: skip
