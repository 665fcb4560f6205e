"""The JVM class archive the set-up made (jobs/class_archive.py): build_spark starts the
suite's own driver from it, and it fits this JDK and Spark classpath (a driver that must use
it, -Xshare:on, fails to start otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys

from fm_config import PROJECT_ROOT
from jobs.jars import archive_path

CODE = """
import sys
from fm_config import SparkConf
from jobs.spark import HUGE_METHODS, build_spark
spark = build_spark(SparkConf(master="local[1]", extra={
    "spark.driver.extraJavaOptions": f"{HUGE_METHODS} -XX:SharedArchiveFile={sys.argv[1]} -Xshare:on"}))
print(spark.range(3).selectExpr("id * 2 AS x").count())
"""


def jvm_arguments(spark) -> list[str]:
    return list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())


def test_a_driver_starts_from_the_archive_the_set_up_made(spark):
    archive = archive_path()
    assert archive.is_file(), "no class archive: scripts/setup.sh makes it"
    assert f"-XX:SharedArchiveFile={archive}" in jvm_arguments(spark)  # the session fixture's options are build_spark's
    env = {k: v for k, v in os.environ.items() if k != "SPARK_SUBMIT_OPTS"}  # the suite's names the archive too
    out = subprocess.run([sys.executable, "-c", CODE, str(archive)], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "3"
