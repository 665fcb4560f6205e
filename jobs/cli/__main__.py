"""``python -m jobs.cli`` (as the cluster bundle's runtime starts it): the ``materialize`` command."""

import sys

from jobs.cli import main

if __name__ == "__main__":  # imported by a walk of the packages, it runs nothing
    sys.exit(main())
