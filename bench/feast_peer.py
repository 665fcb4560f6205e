"""The peer alone: `feast materialize` on the same data, timed as a whole process.

    python -m bench.feast_peer --entities 100000 [--redis-url redis://127.0.0.1:6390/0]

The standard table must exist (``python -m bench.stage_profile --entities N`` writes it).
How Feast is installed, its feature repository and what is timed: bench/harness/feast.py,
which the other benchmarks use.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.harness.feast import materialize
from fm_config import PROJECT_ROOT


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.feast_peer", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=100_000)
    p.add_argument("--redis-url", required=True, help="the Redis server our runs write (Feast uses the next database)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench")
    args = p.parse_args(argv)
    print(json.dumps(materialize(args.entities, args.redis_url, args.workdir.resolve())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
