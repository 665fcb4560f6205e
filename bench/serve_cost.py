"""What TLS and bearer-token authentication cost the feature server (make bench-serve-cost).

    python -m bench.serve_cost [--rate 1000] [--seconds 10] [--rounds 3] [--output bench/results/serve_cost.json]

One throwaway Redis holds ``--entities`` rows of the standard shape (bench/standard.py),
written by the job's Redis writer. The same server (the product's ``serve_conf``, L1 cache
on, every key hot: the cheapest request it answers, so the overhead measured is the largest
share it can be) runs in four modes: plain HTTP, HTTPS, HTTP with JWT bearer tokens (16
distinct ES256 tokens sent round-robin, so after the first requests each one is found in
the token cache), and both. Each mode is a fresh process pinned to CPU 0, vegeta and Redis
on CPU 1, at a fixed rate (open loop, keep-alive connections as production clients keep
them) for ``--seconds`` after a warm-up; the modes alternate, in a rotated order, for
``--rounds`` rounds. Per mode: the server's CPU seconds per request (/proc/<pid>/stat,
user + system), p50 and p99, as the median over rounds with the spread (min-max), and as
ratios against plain HTTP's median. Goal: auth with a cached token at most 10% more CPU per request.

``--before DIR`` adds a fifth mode, ``before``: plain HTTP served by the code checked out in
DIR (e.g. ``git worktree add /tmp/before <commit>``), alternated with the others in the same
run, so what a change costs with TLS and auth off is measured against the code before it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.harness.pki import AUDIENCE, ISSUER
from bench.harness.servers import LOAD_CPU, SERVER_CPU
from fm_config import PROJECT_ROOT

MODES = ("plain", "tls", "auth", "tls+auth")
WARM_UP = 5


def _rows(entities: int):
    """The standard shape as an Arrow batch (numpy, seeded), for the job's Redis writer."""
    import numpy as np
    import pyarrow as pa

    from bench.standard import DIMENSION, FLOATS, INTS, LIST_LEN, VOCABULARY

    rng = np.random.default_rng(7)
    columns: dict = {"_id": [str(i) for i in range(entities)]}
    for j in range(FLOATS):
        values = np.round(rng.random(entities) * [1, 10, 100, 1][j % 4], [2, 2, 2, 3][j % 4])
        columns[f"f{j:02d}"] = pa.array(np.where(rng.random(entities) < 0.6, 0.0, values))
    for j, top in enumerate((30, 400, 10_000, 2_000_000)[:INTS]):
        columns[f"n{j}"] = pa.array(rng.integers(0, top, entities), pa.int64())
    columns["recent_ids"] = pa.array(rng.integers(1, VOCABULARY + 1, (entities, LIST_LEN)).tolist(), pa.list_(pa.int64()))
    columns["embedding"] = pa.array(rng.standard_normal((entities, DIMENSION)).astype("float32").tolist(), pa.list_(pa.float32()))
    return pa.RecordBatch.from_pydict(columns)


def _write(redis_url: str, defs: Path, entities: int) -> None:
    from bench.standard import DATE, SOURCE
    from feature_defs import load_definitions
    from fm_config import RunConf
    from fm_config.redis import RedisSettings
    from jobs.transforms import feature_specs
    from sinks.partition import write_partition
    from sinks.redis.config import redis_sink_config
    from sinks.redis.writer import RedisWritePlan

    loaded = load_definitions(defs)
    source = loaded.source(SOURCE)
    conf = RunConf(redis=RedisSettings(url=redis_url, mode="standalone", capacity_bytes=1 << 30))
    sink = redis_sink_config(conf, source, loaded.entity_of(source), DATE)
    list(write_partition(RedisWritePlan(sink=sink, features=feature_specs(source)), iter([_rows(entities)])))


def _serve_child(spec: str) -> None:
    """The server process: the product's ``serve_conf`` in one mode."""
    from bench.harness.data import reader_conf
    from bench.standard import SOURCE
    from feature_reader.server import serve_conf
    from fm_config.reader import ServerAuthSettings, ServerTlsSettings

    redis_url, defs, port, mode, folder = json.loads(spec)
    conf = reader_conf(redis_url, Path(defs), cache={"enabled": True}, max_entities=1000)
    tls, auth = ServerTlsSettings(), ServerAuthSettings()
    if "tls" in mode:
        tls = ServerTlsSettings(cert_file=f"{folder}/server.pem", key_file=f"{folder}/server.key")
    if "auth" in mode:
        auth = ServerAuthSettings(
            mode="jwt", jwks_file=f"{folder}/jwks.json", issuer=ISSUER, audience=[AUDIENCE], grants={"bench": {"sources": [SOURCE]}}
        )
    conf = conf.model_copy(update={"server": conf.server.model_copy(update={"tls": tls, "auth": auth})})
    serve_conf(conf, "127.0.0.1", port)


BEFORE_CHILD = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from feature_reader.server import serve_conf\n"
    "try:\n"
    "    from bench.harness.data import reader_conf\n"
    "except ImportError:\n"
    "    from bench.reads import _reader_conf as reader_conf\n"
    "url, defs, port = json.loads(sys.argv[1])[:3]\n"
    "serve_conf(reader_conf(url, Path(defs), cache={'enabled': True}, max_entities=1000), '127.0.0.1', port)\n"
)
"""The server of another checkout, plain HTTP (its code may know nothing of TLS or auth). It runs that
checkout's bench/ (its PYTHONPATH): the reader's conf from bench/harness/data.py, or, in a checkout from
before bench/harness/, from bench/reads.py, where it was then."""


def _targets(path: Path, url: str, bodies: list[bytes], tokens: list[str] | None) -> Path:
    import base64

    with path.open("w") as out:
        for i, body in enumerate(bodies):
            header = {"Content-Type": ["application/json"]}
            if tokens:
                header["Authorization"] = [f"Bearer {tokens[i % len(tokens)]}"]
            out.write(json.dumps({"method": "POST", "url": url, "header": header, "body": base64.b64encode(body).decode()}) + "\n")
    return path


def measure(entities: int, rate: int, seconds: float, rounds: int, workdir: Path, log=print, before: Path | None = None) -> dict:
    import ssl

    from bench.harness.data import request_bodies
    from bench.harness.pki import make_pki
    from bench.harness.servers import stop_process, wait_answering
    from bench.standard import SOURCE, write_definitions
    from bench.vegeta import MODULE, attack, cpu_seconds, vegeta_bin
    from feature_defs import load_definitions
    from throwaway.servers import free_port, start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    vegeta_bin()
    redis = start_redis(workdir / "cost-redis", "--hash-max-listpack-value", "256", "--logfile", str(workdir / "cost-redis.log"))
    subprocess.run(["taskset", "-p", "-c", LOAD_CPU, str(redis.process.pid)], check=True, stdout=subprocess.DEVNULL)
    modes = (*MODES, "before") if before else MODES
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    try:
        defs = write_definitions(workdir / "cost-defs")
        log(f"writing {entities:,} entities of the standard shape into Redis")
        _write(redis.url, defs, entities)
        features = [f"{SOURCE}:{f.name}" for f in load_definitions(defs).source(SOURCE).features]
        bodies = request_bodies(entities, 1, features, False, seed=11)
        pki = make_pki(workdir / "cost-pki")
        context = ssl.create_default_context(cafile=f"{pki['folder']}/ca.pem")
        for r in range(rounds):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:  # rotated: no mode always first or last
                port = free_port()
                scheme = "https" if "tls" in mode else "http"
                spec = json.dumps([redis.url, str(defs), port, mode, pki["folder"]])
                run = ["taskset", "-c", SERVER_CPU, sys.executable, "-m", "bench.serve_cost", "--serve-child", spec]
                environ = None
                if mode == "before":
                    run = ["taskset", "-c", SERVER_CPU, sys.executable, "-c", BEFORE_CHILD, spec]
                    environ = {**os.environ, "PYTHONPATH": str(before)}
                process = subprocess.Popen(run, cwd=before if mode == "before" else PROJECT_ROOT, stdout=subprocess.DEVNULL, env=environ,
                                           stderr=open(workdir / f"cost-{mode}.log", "w"), start_new_session=True)  # fmt: skip
                try:
                    wait_answering(f"{scheme}://127.0.0.1:{port}/health", process, context if scheme == "https" else None)
                    url = f"{scheme}://127.0.0.1:{port}/get-online-features"
                    targets = _targets(workdir / f"cost-targets-{mode}.json", url, bodies, pki["tokens"] if "auth" in mode else None)
                    extra = ("-root-certs", f"{pki['folder']}/ca.pem") if scheme == "https" else ()
                    attack(targets, rate, WARM_UP, cpu=LOAD_CPU, extra=extra)  # fills the cache and the token cache
                    time.sleep(1)
                    cpu0 = cpu_seconds(process.pid)
                    rep = attack(targets, rate, seconds, cpu=LOAD_CPU, extra=extra)
                    cpu = cpu_seconds(process.pid) - cpu0
                    lat = rep["latencies"]
                    step = {"cpu_us_per_request": round(cpu / rep["requests"] * 1e6, 1), "p50_ms": round(lat["50th"] / 1e6, 3),
                            "p99_ms": round(lat["99th"] / 1e6, 3), "success": rep["success"],
                            "status_codes": rep["status_codes"]}  # fmt: skip
                    runs[mode].append(step)
                    log(f"  round {r + 1} {mode:>8}: {step['cpu_us_per_request']} us CPU/request, p50 {step['p50_ms']} ms, "
                        f"p99 {step['p99_ms']} ms, success {step['success']:.4f}")  # fmt: skip
                finally:
                    stop_process(process)
    finally:
        redis.stop()
    return {"entities": entities, "rate": rate, "seconds": seconds, "rounds": rounds, "vegeta": MODULE, "runs": runs,
            "before": str(before) if before else None,
            "summary": summarize(runs), "in_process": in_process(pki["folder"], pki["tokens"])}  # fmt: skip


def in_process(folder: str, tokens: list[str], calls: int = 200_000) -> dict:
    """The auth layer alone, in this process: authenticate() with a cached token, authorize() of a
    request by feature references, and a token's first verification (ES256, cache emptied each time)."""
    import asyncio

    from bench.standard import SOURCE
    from feature_defs import DEFAULT_DIR, load_definitions
    from feature_reader.auth import Authenticator
    from fm_config.reader import ServerAuthSettings

    settings = ServerAuthSettings(
        mode="jwt", jwks_file=f"{folder}/jwks.json", issuer=ISSUER, audience=[AUDIENCE], grants={"bench": {"sources": [SOURCE]}}
    )
    auth = Authenticator(settings, load_definitions(DEFAULT_DIR), Path)
    headers = [(b"content-type", b"application/json"), (b"authorization", f"Bearer {tokens[0]}".encode())]
    args = {"features": [f"{SOURCE}:f{j:02d}" for j in range(50)], "feature_service": None}

    async def run() -> dict:
        grants = await auth.authenticate("/get-online-features", headers)
        start = time.perf_counter()
        for _ in range(calls):
            await auth.authenticate("/get-online-features", headers)
        cached = (time.perf_counter() - start) / calls
        start = time.perf_counter()
        for _ in range(calls):
            auth.authorize(grants, args)
        authorize = (time.perf_counter() - start) / calls
        start, first = time.perf_counter(), calls // 400
        for _ in range(first):
            auth.cache.clear()
            await auth.authenticate("/get-online-features", headers)
        return {"cached_token_us": round(cached * 1e6, 2), "authorize_50_refs_us": round(authorize * 1e6, 2),
                "first_verification_us": round((time.perf_counter() - start) / first * 1e6, 1)}  # fmt: skip

    return asyncio.run(run())


def summarize(runs: dict[str, list[dict]]) -> dict:
    """Per mode: median and min-max of each measure, and the median's ratio to plain HTTP's."""
    out: dict = {}
    for mode, steps in runs.items():
        row = {}
        for measure in ("cpu_us_per_request", "p50_ms", "p99_ms"):
            values = [s[measure] for s in steps]
            base = statistics.median(s[measure] for s in runs["plain"])
            median = statistics.median(values)
            row[measure] = {"median": median, "min": min(values), "max": max(values), "ratio": round(median / base, 3) if base else None}
        row["all_200"] = all(set(s["status_codes"]) == {"200"} for s in steps)
        out[mode] = row
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.serve_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=2000, help="entities written (default 2000: every key hot in the cache)")
    p.add_argument("--rate", type=int, default=1000, help="requests per second (default 1000)")
    p.add_argument("--seconds", type=float, default=10, help="seconds measured per mode and round (default 10)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the four modes (default 3)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench")
    p.add_argument("--output", type=Path, help="write the results here as JSON")
    p.add_argument("--before", type=Path, help="also serve plain HTTP from the code checked out in this folder (the code before a change)")
    p.add_argument("--serve-child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve_child:
        _serve_child(args.serve_child)
        return 0
    before = args.before.resolve() if args.before else None
    result = measure(args.entities, args.rate, args.seconds, args.rounds, args.workdir.resolve(), log=lambda m: print(m, flush=True),
                     before=before)  # fmt: skip
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{'mode':>9}  {'CPU us/request (min-max)':>26}  {'x plain':>7}  {'p50 ms':>7}  {'x':>5}  {'p99 ms':>7}  {'x':>5}  all 200")
    for mode, row in result["summary"].items():
        c, p50, p99 = row["cpu_us_per_request"], row["p50_ms"], row["p99_ms"]
        print(f"{mode:>9}  {c['median']:>8.1f} ({c['min']:.1f}-{c['max']:.1f})".ljust(38) + f"  {c['ratio']:>7.3f}  {p50['median']:>7.3f}  "
              f"{p50['ratio']:>5.2f}  {p99['median']:>7.3f}  {p99['ratio']:>5.2f}  {row['all_200']}")  # fmt: skip
    print("in process: " + ", ".join(f"{k} {v}" for k, v in result["in_process"].items()))
    ok = result["summary"]["auth"]["cpu_us_per_request"]["ratio"] <= 1.10
    print(f"auth with a cached token: {result['summary']['auth']['cpu_us_per_request']['ratio'] - 1:+.1%} CPU per request (goal <= +10%)")
    return 0 if ok and all(r["all_200"] for r in result["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
