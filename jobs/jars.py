"""What the set-up fetches and makes for the JVM (``jars/``, or FM_JARS_DIR): the Delta
jars (their version and names are defined here, once), Spark's S3A connector, and the class
archive a driver starts from (jobs/class_archive.py makes it). The Makefile and the scripts
ask on the command line:

    python -m jobs.jars --version      4.4.0
    python -m jobs.jars --artifacts    the Maven coordinates, space-separated (scripts/setup.sh)
    python -m jobs.jars --jars DIR     the jars' paths in DIR, comma-separated (spark-submit --jars)

Standard library only at import: scripts/setup.sh runs it with the system python3 before the
venv exists, and the Airflow DAG files import it at parse time. The Python package
delta-spark is pinned to the same version in requirements.txt.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DELTA_VERSION = "4.4.0"
ARTIFACTS = (f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}", f"io.delta:delta-storage:{DELTA_VERSION}")
"""Maven coordinates (group:artifact:version); delta-spark's artifact names Spark's 4.2 and Scala's 2.13."""
DELTA_JARS = tuple(f"{artifact.split(':')[1]}-{DELTA_VERSION}.jar" for artifact in ARTIFACTS)
"""The jar files Maven copies: delta-spark_4.2_2.13-4.4.0.jar, delta-storage-4.4.0.jar."""


def jars_dir() -> Path:
    """What the set-up fetched and made for the JVM: jars, the class archive (FM_JARS_DIR, else jars/)."""
    from fm_config import PROJECT_ROOT  # not at import: see the module's docstring

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.jars", description="The Delta Lake jars' version, Maven coordinates or paths.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--version", action="store_true", help="the Delta version")
    what.add_argument("--artifacts", action="store_true", help="the Maven coordinates, space-separated")
    what.add_argument("--jars", metavar="DIR", help="the jars' paths in DIR, comma-separated")
    args = parser.parse_args(argv)
    if args.version:
        print(DELTA_VERSION)
    elif args.artifacts:
        print(" ".join(ARTIFACTS))
    else:
        print(",".join(f"{args.jars.rstrip('/')}/{name}" for name in DELTA_JARS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
