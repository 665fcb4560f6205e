"""Run several ``materialize`` commands one after another in one process, as a scheduler
runs them but in one Spark session (one JVM start instead of one per command: the suite's
time). Prints each command's exit code after its output: ``[exit N] <args>``."""

from __future__ import annotations

import json
import sys
import time

from jobs.cli import main

if __name__ == "__main__":
    for argv in json.loads(sys.argv[1]):
        began = time.perf_counter()
        code = main(argv)
        print(f"[exit {code}] {' '.join(argv)}", flush=True)
        print(f"[took {time.perf_counter() - began:.1f} s]", file=sys.stderr, flush=True)
