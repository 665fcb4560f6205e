"""spark-submit entry point: ``spark-submit jobs/materialize.py --env ENV --date D``.

Same job as ``materialize run``; spark-submit chooses master and jars.
"""

import sys

from jobs.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
