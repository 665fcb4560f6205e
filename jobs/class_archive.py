"""The JVM class-data archive: every job's JVM starts from it (``-XX:SharedArchiveFile``).

A Spark driver loads some 20,000 classes before its first query, parsing and verifying each;
an archive of them, memory-mapped at start, cut a session's start and first Delta query on
this machine (2 cores) from 19.6 to 14.3 s, and from 18 to 9.8 s with the quick JIT
(``-XX:TieredStopAtLevel=1``) the suite gives the short-lived JVMs it starts.
It is written once, by the set-up (``python -m jobs.class_archive``): a small job over
sample tables in a temporary folder (Delta writes, a MERGE, reads, the transforms and the
data-quality checks) in a JVM that dumps the classes it loaded when it exits.

It belongs to one JDK build and one Spark classpath: with another the JVM ignores it and
starts as without (its warning is silenced). Nothing here is needed for a job to run.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from jobs.jars import QUIET, archive_path, delta_jars


def inputs_digest() -> str:
    """The JDK build and the classpath (with its folder) the archive was made for: a change means a new one."""
    import pyspark

    java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr
    spark_jars = Path(pyspark.__file__).resolve().parent / "jars"  # the archive names it: a moved .venv needs a new one
    # with size and time: the JVM refuses an archive whose jars changed (a reinstalled .venv)
    jars = [
        str(spark_jars),
        *(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in [*sorted(spark_jars.glob("*.jar")), *delta_jars()]),
    ]
    return hashlib.sha256("\n".join([java, pyspark.__version__, *jars]).encode()).hexdigest()[:16]


def _workload(spark, folder: Path) -> None:
    """A small run's worth of Spark, Delta and great-expectations work (no store is written)."""
    from feature_defs import load_definitions
    from fm_config import QualityConf, RunConf
    from jobs.operations.ledger.events import Entry, Ledger
    from jobs.pipeline.run import validate_source
    from jobs.sample_data import sample_dates, write_sample_tables

    dates = sample_dates(2)
    write_sample_tables(spark, folder / "data", dates, consumers=100, stores=20)
    conf = RunConf(
        env="archive",
        data_root=str(folder / "data"),
        reports_dir=str(folder / "reports"),
        quality=QualityConf(data_docs=False, max_bad_fraction=0.05),
    )
    defs = load_definitions()
    ledger = Ledger(spark, folder / "ledger")
    entry = Entry(
        kind="run", source="s", entity="e", start_date=dates[1], end_date=dates[1], sinks=["redis"], definitions_hash="d", config_hash="c",
        features=["a"], targets={"redis": "redis://h:1/0"}, dates=[dates[1]],
    )  # fmt: skip
    with ledger.leases(60).hold("s", ["redis://h:1/0"], "run"):
        ledger.start(entry)
        for source in sorted(defs.sources):
            validate_source(spark, conf, defs, source, dates[1])
        ledger.finish(entry)
    ledger.list("s")  # the Spark query of the ledger (materialize runs, cleanup); runs read it without Spark


def build(path: Path) -> None:
    from pyspark import SparkContext

    from fm_config import SparkConf
    from jobs.spark import HUGE_METHODS, build_spark

    partial = path.with_name(path.name + ".tmp")
    partial.unlink(missing_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="fm-class-archive-") as tmp:
        options = f"{HUGE_METHODS} -XX:ArchiveClassesAtExit={partial} {QUIET}"
        spark = build_spark(SparkConf(master="local[2]", shuffle_partitions=2, extra={"spark.driver.extraJavaOptions": options}))
        jvm = SparkContext._gateway.proc  # the driver JVM: it writes the archive as it exits
        try:
            _workload(spark, Path(tmp))
        except BaseException:
            partial.unlink(missing_ok=True)  # whatever the JVM writes at exit is not that of a whole job
            raise
        finally:
            spark.stop()
            jvm.stdin.close()  # the gateway exits when its stdin closes
            jvm.wait(timeout=300)
    if not partial.is_file():
        raise SystemExit(f"the JVM wrote no class archive at {partial}")
    os.replace(partial, path)
    print(f"[setup] wrote {path} ({path.stat().st_size >> 20} MiB) in {time.monotonic() - started:.0f}s", flush=True)


def main(argv: list[str]) -> int:
    """``python -m jobs.class_archive``: make the archive when missing or made for another JDK or classpath."""
    path = archive_path()
    stamp = path.with_name("." + path.name + ".inputs")
    digest = inputs_digest()
    if path.is_file() and stamp.is_file() and stamp.read_text() == digest and "--force" not in argv:
        print(f"[setup] JVM class archive present ({path})")
        return 0
    print(f"[setup] writing the JVM class archive {path} (a small job, about a minute)", flush=True)
    stamp.unlink(missing_ok=True)
    build(path)
    stamp.write_text(digest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
