"""The feature server under open-loop load, beside `feast serve` (make bench-serve).

    python -m bench.serve_load [--entities 100000] [--seconds 30] [--output bench/results/serve_results.json]

The job writes the standard table (bench/standard.py) into a throwaway Redis;
`feast materialize` (Feast 0.67, its own venv) writes the same table into the next
database of the same server. Each server runs as one process pinned to CPU 0; vegeta
(from the Go module proxy) and Redis are pinned to CPU 1. Every step is a fixed rate
for ``--seconds``; rates rise (100, 200, 500, 1,000, 2,000, ...) until p99 passes 50 ms or
a request fails, then the gap between the last rate sustained and that one is halved up to
five times (to 10/s), one step per rate (p99 near a knee is noisy: the rate found is the highest one
sustained in its own step). Feast runs first; ours is also run at Feast's highest
sustained rate, to compare p99 there. Shapes: 1 entity x 50 features and 100 x 50; our
server with its L1 cache off (keys uniform over the table: every request reads Redis) and on (keys drawn
from a Zipf distribution, s = 1.1); Feast reads Redis on every request (its server has no
cache) with the cache-off bodies. Both servers get the same request bodies, and answer
the same values (checked before the load). Results: JSON and a chart of p99 against rate.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.harness.servers import LOAD_CPU, SERVER_CPU
from bench.report import print_targets
from fm_config import PROJECT_ROOT

RATES = (100, 200, 500, 1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 10000)
LOWEST = 10
"""Where a server that fails the first rate is tried down to."""
REFINE = 5
"""Halvings of the gap between the last rate sustained and the first that is not."""
SHAPES = (1, 100)
WARM_UP = 15
"""Seconds at 200 requests/s before the first step."""


def _post(url: str, body: bytes) -> dict:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def _sustained(step: dict) -> bool:
    return step["p99_ms"] <= 50 and step["success"] >= 1


def _ladder(name: str, process: subprocess.Popen, targets: Path, seconds: float, log, also: tuple[int, ...] = ()) -> list[dict]:
    """Rising fixed rates until p99 passes 50 ms or a request fails; then the gap between
    the last rate sustained and that one, halved ``REFINE`` times; then the rates in
    ``also`` not measured yet (the peer's highest sustained rate, to compare p99 there)."""
    from bench.vegeta import attack

    attack(targets, 200, WARM_UP, cpu=LOAD_CPU)  # warm-up (and, cache on, a cache filled as at 200/s)
    steps: list[dict] = []
    rates = list(RATES)
    while rates:
        rate = rates.pop(0)
        step = _step(name, process, targets, rate, seconds, log)
        steps.append(step)
        if not _sustained(step):
            if rate > RATES[0] or rate <= LOWEST:
                break
            rates = [r for r in (50, 20, LOWEST) if r < rate]  # the first rate is too much: step down to find what it sustains
        elif rate < RATES[0]:
            break  # the highest rate under the first one it sustains
    good = [s["rate"] for s in steps if _sustained(s)]
    bad = [s["rate"] for s in steps if not _sustained(s) and good and s["rate"] > max(good)]
    if good and bad:
        low, high = max(good), min(bad)
        for _ in range(REFINE):
            rate = int(round((low + high) / 2, -1))  # to 10/s
            if rate in (low, high):
                break
            step = _step(name, process, targets, rate, seconds, log)
            steps.append(step)
            low, high = (rate, high) if _sustained(step) else (low, rate)
    for rate in sorted(set(also) - {s["rate"] for s in steps}):
        steps.append(_step(name, process, targets, rate, seconds, log))
    return sorted(steps, key=lambda s: s["rate"])


def _step(name: str, process: subprocess.Popen, targets: Path, rate: int, seconds: float, log) -> dict:
    """One fixed rate for ``seconds``, once the server has worked off what the last step left queued."""
    from bench.vegeta import attack, cpu_seconds

    _drain(process)
    cpu0, t0 = cpu_seconds(process.pid), time.perf_counter()
    rep = attack(targets, rate, seconds, cpu=LOAD_CPU)
    cpu = (cpu_seconds(process.pid) - cpu0) / (time.perf_counter() - t0)
    lat = rep["latencies"]
    step = {
        "rate": rate, "throughput": round(rep["throughput"], 1), "p50_ms": round(lat["50th"] / 1e6, 3),
        "p99_ms": round(lat["99th"] / 1e6, 3), "p999_ms": None if rep["p999"] is None else round(rep["p999"] / 1e6, 3),
        "max_ms": round(lat["max"] / 1e6, 3), "success": rep["success"], "status_codes": rep["status_codes"],
        "errors": rep["errors"][:3], "server_cpu": round(cpu, 2),
    }  # fmt: skip
    log(
        f"  {name} {rate:>6}/s: p50 {step['p50_ms']} ms, p99 {step['p99_ms']} ms, "
        f"success {step['success']:.4f}, server CPU {step['server_cpu']:.0%}"
    )
    return step


def _drain(process: subprocess.Popen, idle: float = 0.05, limit: float = 180) -> None:
    """Wait until the server has answered what an overloaded step left queued (its CPU idle):
    a server still working off a backlog would fail the next step for the last one's sake."""
    from bench.vegeta import cpu_seconds

    end = time.monotonic() + limit
    while time.monotonic() < end:
        before = cpu_seconds(process.pid)
        time.sleep(1)
        if cpu_seconds(process.pid) - before < idle:
            return
    raise RuntimeError(f"the server was still busy {limit:.0f} s after the last step")


def _serve_child(spec: str) -> None:
    """The server process: the product's `serve` on a conf built for this bench."""
    from bench.harness.data import reader_conf
    from feature_reader.server import serve_conf

    redis_url, defs, cache, port = json.loads(spec)
    conf = reader_conf(redis_url, Path(defs), cache={"enabled": cache}, max_entities=1000)
    serve_conf(conf, "127.0.0.1", port)


def measure(entities: int, seconds: float, feast: bool, workdir: Path, log=print) -> dict:
    from bench.harness.data import load_standard, request_bodies
    from bench.harness.feast import FEAST_FLAGS, feast_bin, materialize
    from bench.harness.servers import stop_process, wait_http
    from bench.standard import SOURCE, write_definitions
    from bench.vegeta import MODULE, vegeta_bin, write_targets
    from throwaway.servers import free_port, start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    vegeta_bin()
    redis = start_redis(workdir / "serve-redis", "--hash-max-listpack-value", "256", "--logfile", str(workdir / "serve-redis.log"))
    # beside vegeta, so the server under test has its core to itself
    subprocess.run(["taskset", "-p", "-c", LOAD_CPU, str(redis.process.pid)], check=True, stdout=subprocess.DEVNULL)
    results: dict = {
        "entities": entities,
        "seconds_per_step": seconds,
        "vegeta": MODULE,
        "server_cpu": SERVER_CPU,
        "load_cpu": LOAD_CPU,
        "runs": {},
    }
    try:
        log(f"writing {entities:,} entities of the standard shape with the job")
        load_standard(workdir, entities, redis.url)
        defs = write_definitions(workdir / "defs")
        from feature_defs import load_definitions

        names = [f.name for f in load_definitions(defs).source(SOURCE).features]
        features = [f"{SOURCE}:{n}" for n in names]
        bodies = {
            (shape, zipf): request_bodies(entities, shape, features, zipf, seed=shape * 2 + zipf)
            for shape in SHAPES
            for zipf in (False, True)
        }
        servers = [(f"ours, cache {'on' if cache else 'off'}", cache) for cache in (False, True)]
        if feast:
            log("Feast 0.67: feast materialize of the same table")
            results["feast_materialize"] = materialize(entities, redis.url, workdir)
            servers.insert(0, ("feast serve", None))  # first: ours is also measured at Feast's highest sustained rate
        answers: dict[str, dict] = {}
        peer_top: dict[int, int] = {}
        for (name, cache), shape in itertools.product(servers, SHAPES):  # a fresh server process per run
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            if cache is None:
                repo = workdir / "feast" / f"repo-{entities}"
                run = ["taskset", "-c", SERVER_CPU, str(feast_bin()), "-c", str(repo), "serve", "-p", str(port), *FEAST_FLAGS]
            else:
                spec = json.dumps([redis.url, str(defs), cache, port])
                run = ["taskset", "-c", SERVER_CPU, sys.executable, "-m", "bench.serve_load", "--serve-child", spec]
            process = subprocess.Popen(
                run, cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=open(workdir / f"serve-{port}.log", "w"), start_new_session=True
            )
            try:
                wait_http(f"{url}/health", process, name)
                zipf = cache is True
                answer = _post(f"{url}/get-online-features", bodies[(shape, False)][0])  # the same request to every server
                key = f"{name}, {shape} x 50"
                # by name: Feast orders its columns its own way (the request's order is ours)
                answers[key] = {n: r["values"] for n, r in zip(answer["metadata"]["feature_names"], answer["results"])}
                targets = write_targets(workdir / f"targets-{shape}-{int(zipf)}.json", f"{url}/get-online-features", bodies[(shape, zipf)])
                also = (peer_top[shape],) if cache is False and peer_top.get(shape) else ()
                results["runs"][key] = _ladder(key, process, targets, seconds, log, also)
                if cache is None:
                    peer_top[shape] = _best(results["runs"][key], 50)
            finally:
                stop_process(process)
        results["sample_answer"] = {n: v[:2] for n, v in list(answers["ours, cache off, 1 x 50"].items())[:4]}
        if feast:
            results["same_values_as_feast"] = all(
                answers[f"{ours}, {s} x 50"] == answers[f"feast serve, {s} x 50"]
                for s in SHAPES
                for ours in ("ours, cache off", "ours, cache on")
            )
    finally:
        redis.stop()
    return results


def _best(steps: list[dict], p99_ms: float) -> int:
    """The highest rate sustained: every request answered and p99 within ``p99_ms``."""
    return max((s["rate"] for s in steps if s["success"] >= 1 and s["p99_ms"] <= p99_ms), default=0)


def _at(steps: list[dict], rate: int) -> float | None:
    return next((s["p99_ms"] for s in steps if s["rate"] == rate), None)


def targets(r: dict) -> list[dict]:
    runs = r["runs"]
    off1, off100 = runs["ours, cache off, 1 x 50"], runs["ours, cache off, 100 x 50"]
    rows = [
        ("1 x 50, cache off: p99 at 1,000 requests/s (ms)", _at(off1, 1000), "<= 2", lambda v: v is not None and v <= 2),
        ("1 x 50, cache off: highest rate with p99 <= 10 ms (requests/s)", _best(off1, 10), ">= 4,000", lambda v: v >= 4000),
        ("100 x 50, cache off: p99 at 100 requests/s (ms)", _at(off100, 100), "<= 10", lambda v: v is not None and v <= 10),
    ]
    if "feast serve, 1 x 50" in runs:
        for shape in SHAPES:
            ours, peer = runs[f"ours, cache off, {shape} x 50"], runs[f"feast serve, {shape} x 50"]
            top, mine = _best(peer, 50), _best(ours, 50)
            if top:
                rows.append(
                    (
                        f"{shape} x 50: highest sustained rate (p99 <= 50 ms), ours / Feast's ({mine} / {top})",
                        round(mine / top, 1),
                        ">= 5x",
                        lambda v: v >= 5,
                    )
                )
                ratio = round(_at(peer, top) / _at(ours, top), 1) if _at(ours, top) else None
                rows.append(
                    (
                        f"{shape} x 50: p99 at Feast's highest sustained rate ({top}/s), Feast's / ours",
                        ratio,
                        ">= 10x",
                        lambda v: v is not None and v >= 10,
                    )
                )
                continue
            # Feast sustains no rate with p99 <= 50 ms: its lowest rate answered in full beside
            # our lowest (a higher rate, so the comparison favours Feast)
            low = min((s for s in peer if s["success"] >= 1), key=lambda s: s["rate"], default=None)
            rows.append(
                (
                    f"{shape} x 50: highest sustained rate (p99 <= 50 ms), ours / Feast's ({mine} / none)",
                    "Feast: none" if mine else None,
                    ">= 5x",
                    lambda v: v is not None,
                )
            )
            if low:
                first = min(ours, key=lambda s: s["rate"])
                rows.append(
                    (
                        f"{shape} x 50: p99, Feast's at {low['rate']}/s / ours at {first['rate']}/s",
                        round(low["p99_ms"] / first["p99_ms"], 1),
                        ">= 10x",
                        lambda v: v >= 10,
                    )
                )
    return [{"target": t, "measured": m, "goal": g, "met": bool(ok(m))} for t, m, g, ok in rows]


def chart(r: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(SHAPES), figsize=(12, 4.5), sharey=True)
    for ax, shape in zip(axes, SHAPES):
        for name, steps in r["runs"].items():
            if name.endswith(f", {shape} x 50"):
                ok = [s for s in steps if s["success"] >= 1]
                ax.plot([s["rate"] for s in ok], [s["p99_ms"] for s in ok], marker="o", label=name.rsplit(",", 1)[0])
        ax.axhline(50, color="grey", linestyle=":", linewidth=1)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="requests/s (open loop, fixed rate)",
            title=f"{shape} entit{'y' if shape == 1 else 'ies'} x 50 features",
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("p99 latency (ms)")
    fig.suptitle(f"materialize serve beside feast serve: one process on one core, {r['seconds_per_step']:.0f} s per step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve_load", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=100_000, help="entities written (default 100000)")
    p.add_argument("--seconds", type=float, default=30, help="seconds per rate (default 30)")
    p.add_argument("--no-feast", action="store_true", help="skip feast serve")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench")
    p.add_argument("--output", type=Path, help="write the results as JSON here, and the chart beside it (.png)")
    p.add_argument("--serve-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_child:
        _serve_child(args.serve_child)
        return 0
    results = measure(args.entities, args.seconds, not args.no_feast, args.workdir.resolve(), log=lambda m: print(m, flush=True))
    results["targets"] = targets(results)
    print_targets(results["targets"])
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n")
        try:
            chart(results, args.output.with_suffix(".png"))
        except ModuleNotFoundError:  # matplotlib: bench/requirements.txt, which `make bench-serve` installs
            print(f"\nwrote {args.output} (no chart: pip install -r bench/requirements.txt for matplotlib)")
            return 0
        print(f"\nwrote {args.output} and {args.output.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
