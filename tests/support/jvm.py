"""JVM options for the short-lived JVMs tests start (CLI runs, Airflow tasks, spark-submit)."""

from __future__ import annotations


def short_lived_jvm_options() -> str:
    """For a JVM that runs one small job: the quick JIT, the serial collector, the class archive.

    C1 alone reserves 48 MB for compiled code, not tiered's 240: a run of both sample
    sources filled it in 23 s, the JVM stopped compiling, then failed to link method handles
    and took the SparkContext down mid-run. Hence the tiered size."""
    from jobs.jars import class_archive_options

    return f"-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m -XX:+UseSerialGC {class_archive_options()}".strip()
