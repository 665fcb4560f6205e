"""python -m bench.soak [--entities 20000] [--warm-up auto] [--quiet 25] [--faults redis_paused,...] [--output FILE.json]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.report import print_targets
from bench.soak.analysis import analyse, goals, print_faults, print_warm_up
from bench.soak.run import Plan, soak
from fm_config import PROJECT_ROOT


def main(argv: list[str] | None = None) -> int:
    plan = Plan()
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=sys.modules["bench.soak"].__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=plan.entities, help=f"entities written (default {plan.entities})")
    auto = "auto (default): until the server's cache holds its working set (its bytes in /metrics level off), at least an entry's lifetime"
    p.add_argument("--warm-up", default="auto", help=f"seconds of load before the first fault, or {auto}")
    p.add_argument("--quiet", type=float, default=plan.quiet, help=f"seconds of load between faults (default {plan.quiet:g})")
    p.add_argument("--faults", default=",".join(plan.faults), help="faults in order, comma-separated (default: all)")
    p.add_argument("--scale", type=float, default=1.0, help="multiply every request rate (default 1)")
    p.add_argument("--allowance", type=float, default=2.0, help="seconds after a store is back that errors still count as the fault's (2)")
    probe = "diagnosis: a full garbage collection and malloc_trim in the server before and after the hostile phase (RSS goals then moot)"
    p.add_argument("--gc-probe", action="store_true", help=probe)
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench" / "soak")
    p.add_argument("--output", type=Path, help="write the report as JSON here")
    p.add_argument("--analyse", type=Path, metavar="RAW", help="only analyse the raw material of an earlier soak (WORKDIR/soak-raw.json)")
    args = p.parse_args(argv)
    plan.entities, plan.quiet = args.entities, args.quiet
    plan.warm_up = None if args.warm_up == "auto" else float(args.warm_up)
    plan.faults = tuple(f for f in args.faults.split(",") if f)
    plan.gc_probe = args.gc_probe
    plan.rates = {k: max(1, round(v * args.scale)) for k, v in plan.rates.items()}
    plan.cluster_rate = max(1, round(plan.cluster_rate * args.scale))
    if args.analyse:
        raw = json.loads(args.analyse.read_text())
    else:
        raw = soak(args.workdir.resolve(), plan, log=lambda m: print(m, flush=True))
        (args.workdir / "soak-raw.json").write_text(json.dumps(raw))
    report = analyse(raw, args.allowance)
    report["targets"] = goals(report)
    print_faults(report)
    print(f"\n{report['requests']:,} requests, {report['answers_200']:,} answered 200; {report['checked']} checked "
          f"({report['entities_checked']:,} entities)")  # fmt: skip
    print_warm_up(report)
    print_targets(report["targets"])
    if report["machine"]:
        m = report["machine"]
        before, after = m["load_average_at_warm_up"][0], m["load_average_at_end"][0]
        print(f"\n{m['cpus']} CPUs; load average {before:.1f} after the warm-up, {after:.1f} at the end")
    for f in report["faults"]:
        if "gc_probe" in f:
            print(f"\n{f['fault']}, a full collection in the server before and after:", json.dumps(f["gc_probe"]))
    if report["wrong_detail"]:
        print("\nfirst wrong answers:", json.dumps(report["wrong_detail"][:3]))
    if report["error_samples"]:
        print("error bodies by status, first:", json.dumps(report["error_samples"])[:1500])
        print("and last:", json.dumps(report["error_samples_last"])[:1500])
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps({**report, "raw_windows": raw["windows"]}, indent=1, default=str) + "\n")
        print(f"\nwrote {args.output}")
    return 0 if all(t["met"] for t in report["targets"]) else 1


if __name__ == "__main__":
    sys.exit(main())
