"""The "fast end to end" targets, measured in one run: `python -m bench.targets`.

    python -m bench.targets [--entities 100000,1000000] [--sources 10] [--no-feast]

For each size: the job as a user runs it (bench/stage_profile.py, a fresh process, Redis
only, then both stores at the largest size), the Redis server's ceiling on the same
data (pre-built commands from one process, bench/runner.py), and `feast materialize` on
the same data into the same server (bench/harness/feast.py, Feast in its own venv). Then N
small sources in one run against one alone. Prints each target with its measured value
and ratio; results in bench/results/targets.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from fm_config import PROJECT_ROOT

HERE = Path(__file__).parent


def _child(module: str, *args: str) -> None:
    subprocess.run([sys.executable, "-m", module, *args], check=True, cwd=PROJECT_ROOT)


def _profile(entities: int, sinks: str, workdir: Path) -> dict:
    out = workdir / f"targets-{entities}-{sinks}.json"
    out.unlink(missing_ok=True)  # stage_profile adds to its output: this run's entry alone
    _child("bench.stage_profile", "--entities", str(entities), "--sinks", sinks, "--workdir", str(workdir), "--output", str(out))
    (run,) = json.loads(out.read_text())["runs"].values()
    return run


def _ceiling(entities: int, workdir: Path, redis_url: str) -> dict:
    """The Redis server's ceiling on the standard data (values/s), from the bench's baselines."""
    from bench.runner import run_one_size

    base = run_one_size("local", workdir, entities, redis_url, with_sql=False, with_baselines=True)["baselines"]
    return {"values_per_s": base["ceiling_values_per_s"], "sample_entities": base["sample_entities"]}


def _row(name: str, measured: float, unit: str, goal: str, ok: bool, ratio: str = "") -> dict:
    return {"target": name, "measured": round(measured, 2), "unit": unit, "goal": goal, "ratio": ratio, "met": ok}


def measure(sizes: list[int], sources: int, feast: bool, workdir: Path) -> dict:
    from bench.harness.feast import materialize
    from bench.standard import VALUES_PER_ENTITY
    from throwaway.servers import start_redis

    # a server of its own (the profiles start theirs) for the ceiling and Feast
    server = start_redis(
        workdir / "targets-redis", "--hash-max-listpack-value", "256", "--logfile", str(workdir / "targets-redis" / "redis.log")
    )
    results: dict = {"sizes": {}}
    try:
        for n in sizes:
            run = _profile(n, "redis", workdir)
            write = run["stages"].get("write redis", {}).get("wall_seconds", 0.0)
            size = {
                "run_seconds": run["run_seconds"],
                "write_seconds": write,
                "stages": {k: v["wall_seconds"] for k, v in run["stages"].items()},
            }
            ceiling = _ceiling(n, workdir, server.url)
            size["redis_ceiling_seconds"] = n * VALUES_PER_ENTITY / ceiling["values_per_s"]
            if feast:
                size["feast"] = materialize(n, server.url, workdir)
            results["sizes"][n] = size
        both = _profile(max(sizes), "both", workdir)
        results["both_sinks"] = {
            "entities": max(sizes),
            "run_seconds": both["run_seconds"],
            "stages": {k: v["wall_seconds"] for k, v in both["stages"].items()},
        }
    finally:
        server.stop()
    if sources:
        out = workdir / "targets-many.json"
        out.unlink(missing_ok=True)  # the profile adds to its output file: this run's entry alone
        _child("bench.stage_profile", "--entities", "10000", "--sources", str(sources), "--workdir", str(workdir), "--output", str(out))
        results["many_sources"] = next(iter(json.loads(out.read_text())["many_sources"].values()))
    results["targets"] = targets(results)
    return results


def targets(results: dict) -> list[dict]:
    rows = []
    goals = {100_000: (12, 5), 1_000_000: (60, 10)}
    for n, size in results["sizes"].items():
        n = int(n)
        seconds, label = size["run_seconds"], f"{n:,} entities, Redis only"
        limit, times = goals.get(n, (None, None))
        if limit:
            rows.append(_row(f"{label}: whole run", seconds, "s", f"<= {limit} s", seconds <= limit, f"{seconds / limit:.2f}x the goal"))
        if "feast" in size and times:
            faster = size["feast"]["seconds"] / seconds
            rows.append(
                _row(
                    f"{label}: Feast's whole process / ours",
                    faster,
                    "x",
                    f">= {times}x",
                    faster >= times,
                    f"Feast {size['feast']['seconds']:.1f} s",
                )
            )
        if n >= 1_000_000:
            other = 1 - size["write_seconds"] / seconds
            rows.append(_row(f"{label}: stages other than the write", 100 * other, "%", "<= 25%", other <= 0.25))
        rows.append(_row(f"{label}: Redis write / the server's ceiling on the same values", size["write_seconds"], "s", "(context)", True,
                         f"ceiling {size['redis_ceiling_seconds']:.1f} s"))  # fmt: skip
    if "both_sinks" in results and results["both_sinks"]["entities"] >= 1_000_000:
        s = results["both_sinks"]["run_seconds"]
        rows.append(
            _row(
                f"{results['both_sinks']['entities']:,} entities, both stores: whole run",
                s,
                "s",
                "<= 100 s",
                s <= 100,
                f"{s / 100:.2f}x the goal",
            )
        )
    if "many_sources" in results:
        m = results["many_sources"]
        rows.append(_row(f"{m['sources']} sources x {m['entities_per_source']:,} entities in one run / one alone",
                         m["ratio"], "x", "<= 2x", m["ratio"] <= 2,
                         f"{m[str(m['sources']) + ' sources']} s / {m['one source']} s"))  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.targets", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", default="100000,1000000", help="comma-separated sizes (default 100000,1000000)")
    p.add_argument("--sources", type=int, default=10, help="small sources of 10,000 entities in one run (0: skip)")
    p.add_argument("--no-feast", action="store_true", help="skip the peer (its ratios are then missing)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench")
    p.add_argument("--output", type=Path, default=HERE / "results" / "targets.json")
    args = p.parse_args(argv)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    results = measure([int(n) for n in args.entities.split(",")], args.sources, not args.no_feast, workdir)
    print("\n| target | measured | goal | beside | met |\n|---|---:|---|---|---|")
    for r in results["targets"]:
        print(f"| {r['target']} | {r['measured']:,} {r['unit']} | {r['goal']} | {r['ratio']} | {'yes' if r['met'] else 'NO'} |")
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
