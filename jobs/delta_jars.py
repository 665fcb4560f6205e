"""The Delta Lake jars: their version and names in one place. jobs/spark.py and the Airflow
DAGs import them; the Makefile and the scripts ask on the command line:

    python -m jobs.delta_jars --version      4.4.0
    python -m jobs.delta_jars --artifacts    the Maven coordinates, space-separated (scripts/setup.sh)
    python -m jobs.delta_jars --jars DIR     the jars' paths in DIR, comma-separated (spark-submit --jars)

Standard library only and nothing done on import: scripts/setup.sh runs it with the system
python3 before the venv exists, and the DAG files import it at parse time. The Python package
delta-spark is pinned to the same version in requirements.txt. (Not named delta.py: spark-submit
runs jobs/materialize.py with jobs/ first on sys.path, where it would hide delta-spark's ``delta``.)
"""

from __future__ import annotations

import argparse
import sys

DELTA_VERSION = "4.4.0"
ARTIFACTS = (f"io.delta:delta-spark_4.2_2.13:{DELTA_VERSION}", f"io.delta:delta-storage:{DELTA_VERSION}")
"""Maven coordinates (group:artifact:version); delta-spark's artifact names Spark's 4.2 and Scala's 2.13."""
DELTA_JARS = tuple(f"{artifact.split(':')[1]}-{DELTA_VERSION}.jar" for artifact in ARTIFACTS)
"""The jar files Maven copies: delta-spark_4.2_2.13-4.4.0.jar, delta-storage-4.4.0.jar."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jobs.delta_jars", description="The Delta Lake jars' version, Maven coordinates or paths.")
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
