"""What a request costs the feature server against the bare stack it runs on, and what the
load's own core has left (make bench-serve-floor).

    python -m bench.serve_floor [--rates 2000,3000] [--seconds 10] [--rounds 2] [--output bench/results/serve_floor.json]

Three servers answer the same 1 x 50 bodies (keys uniform over the table, as `bench.serve_load`'s
cache-off run), each a fresh process pinned to CPU 0, vegeta and Redis on CPU 1 as there:

- ``stack``: uvicorn with httptools and uvloop, a plain ASGI app that parses the body with
  orjson and answers a fixed 50-value body: the floor of any Python server on this stack;
- ``stack+redis-py``: the same app reading each entity's 50-field hash with redis-py's
  asyncio client (hiredis parser) and answering its values: the floor with a store read;
- ``ours``: `materialize serve` (auth off, cache off) on the job's data.

Per server and rate, the server's CPU per request (/proc/<pid>/stat), p99, and the busy
share of each core with Redis's own share of CPU 1 (what vegeta and Redis leave there). The
servers alternate within each round.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

from fm_config import PROJECT_ROOT

SERVERS = ("stack", "stack+redis-py", "ours")
FIELDS = 50

# ---- the floor app (run by uvicorn in its own process: bench.serve_floor:app) ----

_READ_PORT = int(os.environ.get("FLOOR_REDIS_PORT", "0") or 0)
_FIXED = orjson.dumps(
    {"metadata": {"feature_names": [f"f{i}" for i in range(FIELDS)]}, "results": [{"values": [1.5], "statuses": ["PRESENT"]}] * FIELDS}
)
_client = None


async def app(scope, receive, send) -> None:
    global _client
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    out = b"{}"
    if scope["path"] != "/health":
        request = orjson.loads(body)
        out = _FIXED
        if _READ_PORT:
            if _client is None:
                import redis.asyncio as aioredis

                _client = aioredis.Redis(port=_READ_PORT)
            values = await _client.hgetall(f"floor:{request['entities']['entity_id'][0]}")
            results = [{"values": [v.decode()], "statuses": ["PRESENT"]} for v in values.values()]
            out = orjson.dumps({"metadata": {"feature_names": request["features"]}, "results": results})
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": out})


# ---- the measurement ----


def _busy() -> dict[str, tuple[int, int]]:
    """Per CPU: (busy, total) jiffies since boot."""
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                name, *values = line.split()
                v = list(map(int, values))
                out[name] = (sum(v) - v[3] - v[4], sum(v))
    return out


def _start(kind: str, redis, defs: Path, bodies: list[bytes], workdir: Path):
    from bench.harness.servers import SERVER_CPU, wait_http
    from bench.vegeta import write_targets
    from throwaway.servers import free_port

    port = free_port()
    env = dict(os.environ)
    if kind == "ours":
        spec = json.dumps([redis.url, str(defs), False, port])
        run = [sys.executable, "-m", "bench.serve_load", "--serve-child", spec]
    else:
        run = [sys.executable, "-m", "uvicorn", "bench.serve_floor:app", "--port", str(port), "--loop", "uvloop", "--http", "httptools"]
        run += ["--no-access-log", "--log-level", "warning"]
        env["FLOOR_REDIS_PORT"] = str(redis.port) if kind == "stack+redis-py" else ""
    process = subprocess.Popen(
        ["taskset", "-c", SERVER_CPU, *run], cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=open(workdir / f"floor-{kind}.log", "w"), start_new_session=True,
    )  # fmt: skip
    wait_http(f"http://127.0.0.1:{port}/health", process, kind)
    return process, write_targets(workdir / f"floor-{kind}.json", f"http://127.0.0.1:{port}/get-online-features", bodies)


def _step(kind: str, process, targets: Path, rate: int, seconds: float, redis_pid: int, log) -> dict:
    from bench.harness.servers import LOAD_CPU
    from bench.vegeta import attack, cpu_seconds

    cores0, redis0 = _busy(), cpu_seconds(redis_pid)
    cpu0, t0 = cpu_seconds(process.pid), time.perf_counter()
    rep = attack(targets, rate, seconds, cpu=LOAD_CPU)
    wall = time.perf_counter() - t0
    cpu, cores1 = (cpu_seconds(process.pid) - cpu0) / wall, _busy()
    cores = {name: round((cores1[name][0] - cores0[name][0]) / max(1, cores1[name][1] - cores0[name][1]), 3) for name in cores1}
    step = {
        "server": kind, "rate": rate, "throughput": round(rep["throughput"], 1), "success": rep["success"],
        "p99_ms": round(rep["latencies"]["99th"] / 1e6, 2), "server_cpu": round(cpu, 3),
        "server_us_per_request": round(cpu / max(rep["throughput"], 1) * 1e6), "cores_busy": cores,
        "redis_cpu": round((cpu_seconds(redis_pid) - redis0) / wall, 3),
    }  # fmt: skip
    log(
        f"  {kind:>15} {rate:>5}/s: {step['server_us_per_request']:>4} us/request (server CPU {cpu:.0%}), p99 {step['p99_ms']} ms, "
        f"success {rep['success']:.3f}; CPU 1 busy {cores.get('cpu1', 0):.0%} of which Redis {step['redis_cpu']:.0%}"
    )
    return step


def measure(entities: int, rates: list[int], seconds: float, rounds: int, workdir: Path, log=print) -> dict:
    from bench.harness.data import load_standard, request_bodies
    from bench.harness.servers import LOAD_CPU, stop_process
    from bench.standard import SOURCE, write_definitions
    from bench.vegeta import attack, vegeta_bin
    from feature_defs import load_definitions
    from throwaway.servers import start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    vegeta_bin()
    redis = start_redis(workdir / "floor-redis", "--hash-max-listpack-value", "256", "--logfile", str(workdir / "floor-redis.log"))
    subprocess.run(["taskset", "-p", "-c", LOAD_CPU, str(redis.process.pid)], check=True, stdout=subprocess.DEVNULL)
    try:
        log(f"writing {entities:,} entities of the standard shape with the job, and as plain hashes for the floor app")
        load_standard(workdir, entities, redis.url)
        client = redis.client()
        pipe = client.pipeline(transaction=False)
        for i in range(entities):
            pipe.hset(f"floor:{i}", mapping={f"f{j}": f"{i * 0.37 + j:.6f}" for j in range(FIELDS)})
            if i % 5000 == 4999:
                pipe.execute()
        pipe.execute()
        defs = write_definitions(workdir / "defs")
        features = [f"{SOURCE}:{f.name}" for f in load_definitions(defs).source(SOURCE).features]
        bodies = request_bodies(entities, 1, features, False, seed=2)
        steps = []
        for r in range(rounds):
            log(f"round {r + 1} of {rounds}")
            for kind in SERVERS:
                process, targets = _start(kind, redis, defs, bodies, workdir)
                try:
                    attack(targets, 500, 5, cpu=LOAD_CPU)  # warm-up
                    for rate in rates:
                        steps.append({"round": r + 1, **_step(kind, process, targets, rate, seconds, redis.process.pid, log)})
                finally:
                    stop_process(process)
    finally:
        redis.stop()
    return {"entities": entities, "seconds_per_step": seconds, "rates": rates, "steps": steps}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve_floor", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=100_000, help="entities written (default 100000)")
    p.add_argument("--rates", default="2000,3000", help="fixed rates per server, comma-separated (default 2000,3000)")
    p.add_argument("--seconds", type=float, default=10, help="seconds per rate (default 10)")
    p.add_argument("--rounds", type=int, default=2, help="rounds, the servers alternating in each (default 2)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench")
    p.add_argument("--output", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    rates = [int(r) for r in args.rates.split(",")]
    results = measure(args.entities, rates, args.seconds, args.rounds, args.workdir.resolve(), log=lambda m: print(m, flush=True))
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n")
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
