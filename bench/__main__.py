"""`python -m bench` (or `make bench`): the job on the standard data shape against its baselines.

Development tooling, run from a checkout: the installed job never imports it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.runner import run_bench

EXIT_OK, EXIT_USAGE = 0, 2


def build_parser() -> argparse.ArgumentParser:
    bench = argparse.ArgumentParser(
        prog="python -m bench",
        description="Generate Delta tables of the standard shape (per entity: 44 floats, 4 ints, a 10-int list, a 32-dim "
        "embedding), run the real job end to end into a throwaway Redis (hash-max-listpack-value 256) and the "
        "configured SQL store, and measure in the same run: the Redis server's ceiling on the same bytes, redis-py, "
        "encoding alone, bytes per value (with default settings too), raw psycopg upserts from two processes, peak "
        "RSS per size, and a profile of the write path. Prints a table with the targets; --output writes JSON.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n  python -m bench\n  python -m bench --entities 100000,1000000,5000000 --output bench/results/results.json",
    )
    bench.add_argument("--env", help="config env (default: $FM_ENV or local); its sql.dsn is the SQL store measured")
    bench.add_argument("--entities", default="100000", help="comma-separated sizes, each run in a fresh process (default: 100000)")
    bench.add_argument("--output", type=Path, help="write the results as JSON here")
    bench.add_argument(
        "--workdir", type=Path, help="tables and the throwaway Redis live here (default: .run/bench; tables are kept for the next bench)"
    )
    bench.add_argument("--no-sql", action="store_true", help="skip the SQL store (and its baseline)")
    return bench


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        sizes = [int(s.replace("_", "")) for s in args.entities.split(",") if s.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1000:
        print(f"error: --entities: expected comma-separated sizes of at least 1000, got {args.entities!r}", file=sys.stderr)
        return EXIT_USAGE
    run_bench(args.env or os.environ.get("FM_ENV") or "local", sizes, args.output, args.workdir, with_sql=not args.no_sql)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
