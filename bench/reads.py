"""The read side against its ceiling and its peer, in one run: `python -m bench.reads`.

    python -m bench.reads [--entities 100000] [--no-feast] [--output bench/results/reads_results.json]

The standard table (bench/standard.py) is written by the real job into a throwaway
redis-server, and by `feast materialize` (Feast 0.67, its own venv: bench/harness/feast.py)
into the next database of the same server. Then, on the same keys:

- **batches** of 1, 100 and 1,000 entities x 50 features: the sync reader with its cache
  off (every read goes to Redis), beside the **ceiling** (the same HMGETs pre-built as
  RESP on a raw socket, replies parsed by hiredis, nothing decoded), redis-py's pipeline,
  and Feast's ``get_online_features(...).to_dict()`` on the same entities;
- **decode** alone: the replies of 1,000 entities to Python values, ns per value;
- **latency** of one entity: p50/p99 with the cache off (a Redis read; beside one raw
  HMGET on a socket) and on (a hit), each with ``to_dict()`` as a model reads it;
- **stampede**: many asyncio clients over a few hot keys with a short cache TTL, with
  single-flight on and off, reading Redis or SQL: store reads per key per expiry,
  requests/s, p50/p99.

Each number is printed beside its target; ``--output`` writes them all as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import hiredis
import redis

from bench.harness.data import load_standard, reader_conf
from bench.report import print_targets
from fm_config import PROJECT_ROOT

BATCHES = (1, 100, 1000)
VALUES = 50


def _batches(entities: int, size: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [rng.sample(range(entities), size) for _ in range(count)]


def _ceiling(port: int, keys: list[list[bytes]], fields: list[bytes]) -> float:
    """Entities/s: pre-built HMGETs on a raw socket, replies parsed by hiredis, no decode."""
    tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in fields)
    wires = [b"".join(b"*%d\r\n$5\r\nHMGET\r\n$%d\r\n%s\r\n%s" % (len(fields) + 2, len(k), k, tail) for k in batch) for batch in keys]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    start = time.perf_counter()
    for wire, batch in zip(wires, keys):
        sock.sendall(wire)
        reader, got = hiredis.Reader(), 0
        while got < len(batch):
            reader.feed(sock.recv(1 << 20))
            while reader.gets() is not False:
                got += 1
    seconds = time.perf_counter() - start
    sock.close()
    return sum(map(len, keys)) / seconds


def _raw_latency(port: int, keys: list[bytes], fields: list[bytes]) -> dict:
    """One entity's HMGET at a time, pre-built, on a raw socket: the floor of a miss's latency."""
    tail = b"".join(b"$%d\r\n%s\r\n" % (len(f), f) for f in fields)
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    samples = []
    for key in keys:
        wire = b"*%d\r\n$5\r\nHMGET\r\n$%d\r\n%s\r\n%s" % (len(fields) + 2, len(key), key, tail)
        start = time.perf_counter_ns()
        sock.sendall(wire)
        reader = hiredis.Reader()
        while True:
            reader.feed(sock.recv(1 << 16))
            if reader.gets() is not False:
                break
        samples.append(time.perf_counter_ns() - start)
    sock.close()
    return _percentiles(samples)


def _redis_py(port: int, keys: list[list[bytes]], fields: list[bytes]) -> float:
    client = redis.Redis(port=port)
    start = time.perf_counter()
    for batch in keys:
        pipe = client.pipeline(transaction=False)
        for k in batch:
            pipe.hmget(k, fields)
        pipe.execute()
    seconds = time.perf_counter() - start
    client.close()
    return sum(map(len, keys)) / seconds


FEAST_SCRIPT = """
import json, sys, time
from feast import FeatureStore
repo, source, names, plan = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
store = FeatureStore(repo_path=repo)
features = [f"{source}:{n}" for n in names]
out = {}
for size, batches in plan.items():
    store.get_online_features(features=features, entity_rows={"entity_id": batches[0]}).to_dict()
    start = time.perf_counter()
    for ids in batches:
        store.get_online_features(features=features, entity_rows={"entity_id": ids}).to_dict()
    out[size] = sum(map(len, batches)) / (time.perf_counter() - start)
sample = store.get_online_features(features=features, entity_rows={"entity_id": plan["1000"][0][:5]}).to_dict()
out["sample"] = {k: v for k, v in sample.items() if k in ("entity_id", "f00", "n1")}
print(json.dumps(out))
"""


def _feast(workdir: Path, entities: int, redis_url: str, plan: dict[int, list[list[int]]], names: list[str]) -> dict:
    from bench.harness.feast import feast_bin, materialize
    from bench.standard import SOURCE

    written = materialize(entities, redis_url, workdir)
    repo = workdir / "feast" / f"repo-{entities}"
    python = feast_bin().parent / "python"
    done = subprocess.run(
        [str(python), "-c", FEAST_SCRIPT, str(repo), SOURCE, json.dumps(names), json.dumps({str(k): v for k, v in plan.items()})],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"Feast's get_online_features failed: {done.stderr[-2000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["materialize_seconds"] = written["seconds"]
    return out


def _percentiles(samples_ns: list[int]) -> dict:
    q = statistics.quantiles(samples_ns, n=1000)
    return {"p50_us": round(statistics.median(samples_ns) / 1000, 1), "p99_us": round(q[989] / 1000, 1), "p999_us": round(q[998] / 1000, 1)}


def _latency(reader, source: str, ids: list[int], to_dict: bool = True) -> dict:
    """One entity at a time: the call and, as a model would, its values (``to_dict()``)."""
    samples = []
    for i in ids:
        start = time.perf_counter_ns()
        result = reader.get_online_features([source], {"entity_id": [i]})
        if to_dict:
            result.to_dict()
        samples.append(time.perf_counter_ns() - start)
    return _percentiles(samples)


async def _stampede(conf, defs, source: str, entities: int, clients: int, seconds: float, hot: int) -> dict:
    """``clients`` asyncio clients read Zipf-chosen keys among ``hot`` for ``seconds``."""
    from feature_reader import AsyncFeatureReader
    from feature_reader.errors import StoreError

    rng = random.Random(7)
    weights = [1 / (k + 1) for k in range(hot)]
    ids = rng.sample(range(entities), hot)
    latencies: list[int] = []
    errors: list[str] = []
    reader = AsyncFeatureReader(conf, defs)
    stop = time.perf_counter() + seconds

    async def client(seed: int) -> None:
        r = random.Random(seed)
        while time.perf_counter() < stop:
            key = r.choices(ids, weights)[0]
            start = time.perf_counter_ns()
            try:
                await reader.get_online_features([source], {"entity_id": [key]})
            except StoreError as exc:  # a timeout under overload: counted, its wait kept in the latencies
                errors.append(type(exc).__name__)
            latencies.append(time.perf_counter_ns() - start)
            await asyncio.sleep(0)  # a request's own I/O: a client answered from the cache must not hog the loop

    async with reader:
        start = time.perf_counter()
        await asyncio.gather(*(client(s) for s in range(clients)))
        wall = time.perf_counter() - start
        stats, left = reader.stats, len(reader._flights)
    ttl = conf.reader.cache.ttl_seconds
    return {
        "clients": clients, "hot_keys": hot, "ttl_seconds": ttl, "requests_per_s": round(len(latencies) / wall),
        **_percentiles(latencies), "store_reads_per_s": round(stats.get("entities_read", 0) / wall),
        "reads_per_key_per_expiry": round(stats.get("entities_read", 0) / (hot * wall / ttl), 2),
        "coalesced": stats.get("coalesced", 0), "errors": len(errors), "left_on_scoreboard": left,
    }  # fmt: skip


def measure(entities: int, rounds: int, feast: bool, workdir: Path) -> dict:
    from bench.standard import SOURCE, write_definitions
    from feature_defs import load_definitions
    from feature_reader import FeatureReader
    from feature_reader.redis_reads import _Plan
    from feature_reader.rows import Unit
    from serializers import field_id
    from serializers.keys import freshness_field, key_prefix, redis_key
    from throwaway.servers import start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    server = start_redis(workdir / "reads-redis", "--hash-max-listpack-value", "256", "--logfile", str(workdir / "reads-redis.log"))
    results: dict = {"entities": entities}
    try:
        print(f"writing {entities:,} entities of the standard shape with the job", flush=True)
        load_standard(workdir, entities, server.url)
        folder = write_definitions(workdir / "defs")
        defs = load_definitions(folder)
        source = defs.source(SOURCE)
        names = [f.name for f in source.features]
        prefix = key_prefix(defs.entities[source.entity].prefix)
        fields = [freshness_field(SOURCE)] + [field_id(n) for n in names]
        plan = {size: _batches(entities, size, max(rounds, 2000 // size) if size < 1000 else rounds, seed=size) for size in BATCHES}
        gc.collect()
        gc.freeze()  # what a service does after start-up: the tables above are not garbage

        batches: dict = {}
        with FeatureReader(reader_conf(server.url, folder, cache={"enabled": False}, max_entities=1000), defs) as reader:
            for size, ids in plan.items():
                keys = [[redis_key(prefix, str(i)) for i in b] for b in ids]
                reader.get_online_features([SOURCE], {"entity_id": ids[0]}).to_dict()  # warm
                start = time.perf_counter()
                for b in ids:
                    reader.get_online_features([SOURCE], {"entity_id": b}).to_dict()  # as Feast's is timed
                ours = sum(map(len, ids)) / (time.perf_counter() - start)
                batches[size] = {
                    "ours": round(ours),
                    "ceiling": round(_ceiling(server.port, keys, fields)),
                    "redis_py": round(_redis_py(server.port, keys, fields)),
                }
                batches[size]["us_per_value"] = round(1e6 / ours / VALUES, 3)
                print(f"  {size:>5} x {VALUES}: {batches[size]}", flush=True)
            # decode alone: the replies of 1,000 entities to rows of Python values
            store = reader._stores["redis"]
            units = [Unit(SOURCE, str(i)) for i in plan[1000][0]]
            read_plan = _Plan(store, units, {SOURCE: list(source.features)})
            pipe = store.client.pipeline(transaction=False)
            for k, key in enumerate(read_plan.keys):
                pipe.hmget(key, read_plan.key_fields(k))
            replies = pipe.execute()
            columns = list(zip(*replies))[1:]  # the features' raw values, a column each
            decoder = read_plan.fields[SOURCE].decoder
            start, n = time.perf_counter(), 20
            for _ in range(n):
                decoder.decode(columns)
            results["decode_ns_per_value"] = round((time.perf_counter() - start) / n / (len(units) * VALUES) * 1e9)
            start = time.perf_counter()
            for _ in range(n):
                read_plan.rows(replies, 0, False)
            results["rows_ns_per_value"] = round((time.perf_counter() - start) / n / (len(units) * VALUES) * 1e9)
            singles = [b[0] for b in _batches(entities, 1, 5000, seed=11)]
            results["latency_miss"] = _latency(reader, SOURCE, singles)
            results["latency_raw"] = _raw_latency(server.port, [redis_key(prefix, str(i)) for i in singles], fields)
        with FeatureReader(reader_conf(server.url, folder), defs) as reader:
            reader.get_online_features([SOURCE], {"entity_id": [1]})
            results["latency_hit"] = _latency(reader, SOURCE, [1] * 20000)
            results["latency_hit_call_alone"] = _latency(reader, SOURCE, [1] * 20000, to_dict=False)
        results["batches"] = batches
        print(
            f"  decode {results['decode_ns_per_value']} ns/value (rows {results['rows_ns_per_value']}); "
            f"one entity: miss {results['latency_miss']}, "
            f"raw HMGET {results['latency_raw']}, hit {results['latency_hit']}",
            flush=True,
        )

        # stampede, as in the report of the design: many clients, a few hot keys, a 50 ms TTL
        # without jitter or early refresh (every expiry a cold miss), single-flight off and
        # on, from Redis and from SQL (the report's PostgreSQL behind the cache)
        stampede: dict = {}
        for store, sinks, clients in (("redis", ("redis",), 500), ("redis", ("redis",), 64), ("sql", ("sql",), 64)):
            for label, sf in (("single-flight off", False), ("single-flight on", True)):
                conf = reader_conf(
                    server.url,
                    folder,
                    sinks=sinks,
                    single_flight=sf,
                    timeout_ms=5000,
                    cache={"ttl_seconds": 0.05, "jitter": 0, "early_refresh_beta": 0},
                )
                run = stampede.setdefault(f"{store}, {clients} clients", {})
                run[label] = asyncio.run(_stampede(conf, defs, SOURCE, entities, clients=clients, seconds=5, hot=50))
                print(f"  stampede, {store}, {clients} clients, {label}: {run[label]}", flush=True)
        results["stampede"] = stampede

        if feast:
            print("Feast 0.67: feast materialize, then get_online_features on the same batches", flush=True)
            peer = _feast(workdir, entities, server.url, {k: v[: max(5, len(v) // 10)] for k, v in plan.items()}, names)
            with FeatureReader(reader_conf(server.url, folder, cache={"enabled": False}), defs) as reader:
                ours = reader.get_online_features([f"{SOURCE}:f00", f"{SOURCE}:n1"], {"entity_id": peer["sample"]["entity_id"]}).to_dict()
            peer["same_values_as_ours"] = {k: ours[k] for k in ("f00", "n1")} == {k: peer["sample"][k] for k in ("f00", "n1")}
            results["feast"] = peer
            print(f"  {peer}", flush=True)
    finally:
        server.stop()
        gc.unfreeze()
    return results


def targets(r: dict) -> list[dict]:
    b = r["batches"]
    rows = [
        ("1,000 x 50 batch / raw HMGET ceiling", b[1000]["ours"] / b[1000]["ceiling"], ">= 0.8x", lambda v: v >= 0.8),
        ("decode to Python values, ns per value", r["decode_ns_per_value"], "<= 150", lambda v: v <= 150),
        (
            f"one entity, cache miss p99 (us; one raw HMGET: {r['latency_raw']['p99_us']})",
            r["latency_miss"]["p99_us"],
            "<= 250",
            lambda v: v <= 250,
        ),
        ("one entity, cache hit p99 (us)", r["latency_hit"]["p99_us"], "<= 15", lambda v: v <= 15),
    ]
    for run, got in r["stampede"].items():
        on, off = got["single-flight on"], got["single-flight off"]
        rows.append((f"stampede p99, single-flight on / off ({run})", on["p99_us"] / off["p99_us"], "<= 0.2x", lambda v: v <= 0.2))
        rows.append(
            (
                f"stampede store reads per key per expiry, single-flight on ({run})",
                on["reads_per_key_per_expiry"],
                "<= 1",
                lambda v: v <= 1.0,
            )
        )
    if "feast" in r:
        for size in BATCHES:
            ratio = b[size]["ours"] / r["feast"][str(size)]
            rows.append(
                (
                    f"{size:,} x 50 batch / Feast get_online_features (the raw ceiling: {b[size]['ceiling'] / r['feast'][str(size)]:.1f}x)",
                    ratio,
                    ">= 20x",
                    lambda v: v >= 20,
                )
            )
    return [{"target": name, "measured": round(v, 3), "goal": goal, "met": ok(v)} for name, v, goal, ok in rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.reads", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=100_000, help="entities written (default 100000)")
    p.add_argument("--rounds", type=int, default=50, help="batches of 1,000 read (smaller batches: as many entities)")
    p.add_argument("--no-feast", action="store_true", help="skip Feast (no venv of its own needed)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench")
    p.add_argument("--output", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    results = measure(args.entities, args.rounds, not args.no_feast, args.workdir.resolve())
    results["targets"] = targets(results)
    print_targets(results["targets"])
    if args.output:
        args.output.write_text(json.dumps(results, indent=1) + "\n")
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
