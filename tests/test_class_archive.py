"""The JVM class archive the set-up made (jobs/class_archive.py) fits this JDK and Spark
classpath: a driver that must use it (-Xshare:on fails the start otherwise) runs a query."""

from __future__ import annotations

import os
import subprocess
import sys

from jobs import class_archive
from jobs.config import PROJECT_ROOT

CODE = """
import sys
from jobs.config import SparkConf
from jobs.spark import HUGE_METHODS, build_spark
spark = build_spark(SparkConf(master="local[1]", extra={"spark.driver.extraJavaOptions": f"{HUGE_METHODS} -XX:SharedArchiveFile={sys.argv[1]} -Xshare:on"}))
jvm = spark.sparkContext._jvm
print(spark.range(3).selectExpr("id * 2 AS x").count())
print([a for a in jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments() if "share" in a.lower()])
"""


def test_a_driver_starts_from_the_archive_the_set_up_made():
    archive = class_archive.archive_path()
    assert archive.is_file(), "no class archive: scripts/setup.sh makes it"
    assert class_archive.java_options() == f"-XX:SharedArchiveFile={archive} {class_archive.QUIET}"
    env = {k: v for k, v in os.environ.items() if k != "SPARK_SUBMIT_OPTS"}  # the suite's names the archive too
    out = subprocess.run([sys.executable, "-c", CODE, str(archive)], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert lines[-2] == "3" and lines[-1] == str([f"-XX:SharedArchiveFile={archive}", "-Xshare:on"])
