"""What the set-up fetched and made for the JVM (``jars/``, or FM_JARS_DIR): the Delta
jars, Spark's S3A connector, and the class archive a driver starts from
(jobs/class_archive.py makes it). Read by every driver; no Spark import."""

from __future__ import annotations

import os
from pathlib import Path

from fm_config import PROJECT_ROOT

DELTA_JARS = ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar")


def jars_dir() -> Path:
    """What the set-up fetched and made for the JVM: jars, the class archive (FM_JARS_DIR, else jars/)."""
    return Path(os.environ.get("FM_JARS_DIR") or PROJECT_ROOT / "jars")


def delta_jars() -> list[Path]:
    """The Delta jars fetched by the set-up (no Ivy download at run time)."""
    folder = jars_dir()
    jars = [folder / name for name in DELTA_JARS]
    missing = [str(j) for j in jars if not j.is_file()]
    if missing:
        raise FileNotFoundError(f"Delta jars missing: {', '.join(missing)}; run `make setup` (scripts/setup.sh) to fetch them")
    return jars


S3A_SCHEMES = ("s3a://", "s3://", "s3n://")


def s3a_jars() -> list[Path]:
    """Spark's S3A connector (hadoop-aws and the AWS SDK modules it calls), fetched by the set-up."""
    folder = jars_dir() / "s3a"
    jars = sorted(folder.glob("*.jar"))
    if not jars:
        raise FileNotFoundError(f"S3A jars missing in {folder}; run `make setup` (scripts/setup.sh) to fetch them")
    return jars


ARCHIVE_NAME = "spark-classes.jsa"
QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""A JVM that cannot use the archive (another JDK or classpath) says so on every start: not news."""


def archive_path() -> Path:
    return jars_dir() / ARCHIVE_NAME


def class_archive_options() -> str:
    """What a driver's JVM options add for the archive: nothing when there is none (or its
    path has a space, which Spark's option splitting would break)."""
    path = archive_path()
    if not path.is_file() or " " in str(path):
        return ""
    return f"-XX:SharedArchiveFile={path} {QUIET}"
