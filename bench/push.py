"""Pushes: `materialize serve` beside `feast serve`, both taking Feast's `POST /push` into Redis (make bench-push).

    python -m bench.push [--pushes 1:800,10:800,100:400] [--rounds 8] [--connections 2] [--output bench/results/push.json]

One Feast repository (Feast 0.67, its own venv: throwaway/feast_venv.py): an entity ``driver``
(``driver_id`` int64), a PushSource ``driver_push`` whose batch source is a small Parquet file,
and a feature view ``driver_stats`` (``conv_rate`` float32, ``acc_rate`` float32,
``avg_daily_trips`` int64) reading the push source. ``feast apply`` runs first (untimed).
This project's definitions are ``materialize import-feast``'s output for the same repository
(it maps the PushSource to ``push_source: driver_push``); if that output has no push source
(an older import), the bench writes the equivalent YAML itself and the results say so.

One throwaway redis-server: database 0 for ours, 1 for Feast's. ``materialize serve`` (one
process, ``server.push.enabled: true``, ``sinks: [redis]``) and ``feast serve`` (one worker,
as bench/serve_load.py runs it) run side by side, each pinned to CPU 0; the client and Redis
share CPU 1. The client is closed-loop: ``--connections`` threads, each with one keep-alive
connection (http.client) sending its requests one after the other, latency measured per
request. For each size N (rows per push) both servers get the same pushes, with the same
bodies in the same order: ``--rounds`` rounds, each round one share of the pushes to one server
then the same share to the other (the first server alternating), after a warm-up of each
size (untimed). Each push carries N distinct drivers (each connection its own drivers, so no
two pushes of one driver are in flight at once) and an event time one second later than the
push before it, so every row is newer than what the store holds and is written (our server's
answers count what it wrote and what it kept as newer: all must be written). Rows per second
are the rows of a size over the seconds its rounds took on that server; beside them, each
server's CPU (user + system of its processes, /proc) per row, which other jobs on a shared
machine disturb less than wall time, and the median over rounds of ours / Feast's rows per
second within a round (the two halves of a round run back to back).

Afterwards: each database must hold a key for every driver pushed (ours also holds the
description key its first push recorded), and both servers must answer the last values pushed
for a sample of drivers through ``POST /get-online-features``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.confs import bench_conf, redis_only
from bench.harness.servers import LOAD_CPU, SERVER_CPU
from fm_config import PROJECT_ROOT

HERE = Path(__file__).parent
ENV = "bench_push"
OUR_DB, FEAST_DB = 0, 1
PUSH_SOURCE, VIEW, ENTITY, PREFIX = "driver_push", "driver_stats", "driver", "d"
"""PREFIX: the entity type's Redis key prefix (import-feast's: the initials of its name)."""
FEATURES = ("conv_rate", "acc_rate", "avg_daily_trips")
SIZES = (1, 10, 100)
PUSHES = {1: 800, 10: 800, 100: 400}
"""Pushes per size and server (over all rounds)."""
WARM_UP = 40
"""Untimed pushes of each size to each server before its rounds."""
DRIVERS_PER_CONNECTION = 1000
FIRST_DRIVER = 1001
SAMPLE = 20
"""Drivers whose last pushed values are read back from both servers."""


# -- the repository and the definitions ---------------------------------------------------


def feast_repo(folder: Path, redis_port: int) -> Path:
    """Feast's repository: feature_store.yaml (Redis database FEAST_DB), the batch file, the definitions."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(folder, ignore_errors=True)
    (folder / "data").mkdir(parents=True)
    hour = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
    drivers = list(range(FIRST_DRIVER, FIRST_DRIVER + 5))
    table = pa.table(
        {
            "driver_id": pa.array(drivers, pa.int64()),
            "event_timestamp": pa.array([hour] * len(drivers), pa.timestamp("us", tz="UTC")),
            "created": pa.array([hour.replace(tzinfo=None)] * len(drivers), pa.timestamp("us")),
            "conv_rate": pa.array([0.5] * len(drivers), pa.float32()),
            "acc_rate": pa.array([0.25] * len(drivers), pa.float32()),
            "avg_daily_trips": pa.array([10] * len(drivers), pa.int64()),
        }
    )
    data = folder / "data" / "driver_stats.parquet"
    pq.write_table(table, data)
    (folder / "feature_store.yaml").write_text(
        "project: fm_push\nregistry: data/registry.db\nprovider: local\nentity_key_serialization_version: 3\n"
        f'online_store:\n  type: redis\n  connection_string: "127.0.0.1:{redis_port},db={FEAST_DB}"\n'
        "offline_store:\n  type: file\n"
    )
    (folder / "features.py").write_text(
        "from datetime import timedelta\n\n"
        "from feast import Entity, FeatureView, Field, FileSource, PushSource, ValueType\n"
        "from feast.types import Float32, Int64\n\n"
        f'driver = Entity(name="{ENTITY}", join_keys=["driver_id"], value_type=ValueType.INT64)\n'
        f'batch = FileSource(name="driver_stats_batch", path="{data}", timestamp_field="event_timestamp", '
        'created_timestamp_column="created")\n'
        f'driver_push = PushSource(name="{PUSH_SOURCE}", batch_source=batch)\n'
        f'driver_stats = FeatureView(name="{VIEW}", entities=[driver], ttl=timedelta(days=1), online=True, source=driver_push, schema=[\n'
        '    Field(name="conv_rate", dtype=Float32), Field(name="acc_rate", dtype=Float32), Field(name="avg_daily_trips", dtype=Int64),\n'
        "])\n"
    )
    return folder


FALLBACK_ENTITIES = """\
entities:
  - name: {entity}
    prefix: {prefix}
    keys:
      - {{name: driver_id, type: int}}
    sql_table: driver_features
"""
FALLBACK_SOURCE = """\
source:
  name: {view}
  entity: {entity}
  location: {data}
  format: parquet
  layout: wide
  select_by: event_time
  timestamp_column: event_timestamp
  created_column: created
  key_columns: [driver_id]
  push_source: {push}
  feast_ttl_seconds: 86400
  on_tie: keep_one
  features:
    - {{name: conv_rate, type: float, precision: float32}}
    - {{name: acc_rate, type: float, precision: float32}}
    - {{name: avg_daily_trips, type: int}}
"""


def our_definitions(repo: Path, out: Path) -> dict:
    """``materialize import-feast`` of the repository into ``out``; the YAML written here
    instead when the import maps no push source (or fails). What was done, and why."""
    import yaml

    from throwaway import feast_venv

    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(PROJECT_ROOT / ".venv" / "bin" / "materialize"), "import-feast", str(repo), "--out", str(out),
           "--feast-python", str(feast_venv.python())]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=PROJECT_ROOT)
    source = out / f"{VIEW}.yaml"
    if done.returncode == 0 and source.is_file():
        pushed = ((yaml.safe_load(source.read_text()) or {}).get("source") or {}).get("push_source")
        if pushed == PUSH_SOURCE:
            return {"by": "materialize import-feast", "source_yaml": source.read_text()}
        why = f"import-feast wrote no push_source (found {pushed!r}): this checkout's import does not map PushSources yet"
    else:
        why = f"import-feast failed ({done.returncode}): {(done.stderr or done.stdout)[-500:]}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "entities.yaml").write_text(FALLBACK_ENTITIES.format(entity=ENTITY, prefix=PREFIX))
    text = FALLBACK_SOURCE.format(view=VIEW, entity=ENTITY, data=repo / "data" / "driver_stats.parquet", push=PUSH_SOURCE)
    source.write_text(text)
    return {"by": "written by the bench", "why": why, "source_yaml": text}


def our_conf(workdir: Path, defs: Path, redis_url: str) -> Path:
    """A config folder: the project's conf/base and an env of this bench's own, pushes on."""
    return bench_conf(
        workdir,
        ENV,
        redis_only(workdir, defs, redis_url) + "server:\n  push:\n    enabled: true\n",
    )


# -- the pushes ---------------------------------------------------------------------------


def plan(sizes: dict[int, int], rounds: int, connections: int, start: dt.datetime) -> dict:
    """The request bodies, built before anything is timed: per size, ``warm`` (per connection)
    and ``rounds`` (per round, per connection), and the last values pushed per driver.

    The event time rises by one second a push (whole seconds: the stores keep whole seconds),
    in the order each connection sends them; connection c pushes drivers of its own block."""
    import random

    rng = random.Random(29)
    clock = [0]
    last: dict[int, dict] = {}
    cursor = [0] * connections

    def body(c: int, n: int) -> bytes:
        block = FIRST_DRIVER + c * DRIVERS_PER_CONNECTION
        ids = [block + (cursor[c] + i) % DRIVERS_PER_CONNECTION for i in range(n)]
        cursor[c] += n
        clock[0] += 1
        when = (start + dt.timedelta(seconds=clock[0])).isoformat()
        created = (start + dt.timedelta(seconds=clock[0], milliseconds=500)).isoformat()
        rows = {
            "driver_id": ids,
            "event_timestamp": [when] * n,
            "created": [created] * n,
            "conv_rate": [round(rng.random(), 4) for _ in ids],  # 4 digits: exact enough in float32 to compare
            "acc_rate": [round(rng.random(), 4) for _ in ids],
            "avg_daily_trips": [rng.randrange(0, 1000) for _ in ids],
        }
        for i, d in enumerate(ids):
            last[d] = {f: rows[f][i] for f in FEATURES}
        return json.dumps({"push_source_name": PUSH_SOURCE, "df": rows, "to": "online"}).encode()

    out: dict = {"sizes": {}, "last": last}
    for n, total in sizes.items():
        per = max(1, total // (rounds * connections))
        warm = [[body(c, n) for _ in range(max(1, WARM_UP // connections))] for c in range(connections)]
        timed = [[[body(c, n) for _ in range(per)] for c in range(connections)] for _ in range(rounds)]
        out["sizes"][n] = {"warm": warm, "rounds": timed, "pushes_per_round": per * connections}
    return out


def drive(port: int, per_connection: list[list[bytes]]) -> tuple[float, list[float], list[bytes], list]:
    """Send each connection's bodies in order over its own keep-alive connection, all
    connections at once; the wall seconds, each request's latency, the answers and the failures."""
    latencies: list[list[float]] = [[] for _ in per_connection]
    answers: list[bytes] = []
    failures: list = []
    ready = threading.Barrier(len(per_connection) + 1)

    def run(c: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.connect()
        headers = {"Content-Type": "application/json"}
        mine = latencies[c]
        ready.wait()
        for body in per_connection[c]:
            t0 = time.perf_counter()
            conn.request("POST", "/push", body, headers)
            answer = conn.getresponse()
            data = answer.read()
            mine.append(time.perf_counter() - t0)
            if answer.status != 200:
                failures.append((answer.status, data[:300].decode(errors="replace")))
            answers.append(data)
        conn.close()

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in range(len(per_connection))]
    for t in threads:
        t.start()
    ready.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - start, [x for xs in latencies for x in xs], answers, failures


def count_written(answers: list[bytes], totals: dict) -> None:
    """Add up our server's answers: the rows it wrote to Redis, and those it kept as newer (none expected)."""
    for data in answers:
        redis = json.loads(data)["written"][VIEW]["redis"]
        totals["written"] += redis["written"]
        totals["kept_newer"] += redis["kept_newer"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- servers ------------------------------------------------------------------------------


def start_servers(workdir: Path, repo: Path, conf: Path) -> dict:
    from bench.harness.feast import FEAST_FLAGS
    from bench.harness.servers import wait_http
    from throwaway import feast_venv
    from throwaway.servers import free_port

    servers = {}
    for label in ("ours", "feast"):
        port = free_port()
        if label == "ours":
            cmd = [str(PROJECT_ROOT / ".venv" / "bin" / "materialize"), "serve", "--env", ENV, "--port", str(port)]
            env, cwd = dict(os.environ, FM_CONF_DIR=str(conf), FM_ENV=ENV), PROJECT_ROOT
        else:
            cmd = [str(feast_venv.feast()), "serve", "-p", str(port), *FEAST_FLAGS]
            env, cwd = dict(os.environ), repo
        process = subprocess.Popen(
            ["taskset", "-c", SERVER_CPU, *cmd], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
            stderr=open(workdir / f"push-{label}.log", "w"), start_new_session=True,
        )  # fmt: skip
        servers[label] = {"port": port, "process": process}
        wait_http(f"http://127.0.0.1:{port}/health", process, f"{label} server")
    return servers


def read_back(port: int, drivers: list[int]) -> dict[int, dict]:
    """``POST /get-online-features`` of the drivers: their values by driver."""
    body = json.dumps({"features": [f"{VIEW}:{f}" for f in FEATURES], "entities": {"driver_id": drivers}}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/get-online-features", body, {"Content-Type": "application/json"})
    answer = conn.getresponse()
    data = json.loads(answer.read())
    conn.close()
    if answer.status != 200:
        raise RuntimeError(f"get-online-features on port {port}: {answer.status} {data}")
    names = data["metadata"]["feature_names"]
    out: dict[int, dict] = {d: {} for d in drivers}
    for name, column in zip(names, data["results"]):
        if name in FEATURES:
            for d, v in zip(drivers, column["values"]):
                out[d][name] = v
    return out


def same(pushed: dict, read: dict) -> bool:
    for f in FEATURES:
        a, b = pushed[f], read.get(f)
        if b is None or abs(float(a) - float(b)) > 1e-6 * max(1.0, abs(float(a))):
            return False
    return True


# -- the run ------------------------------------------------------------------------------


def measure(sizes: dict[int, int], rounds: int, connections: int, workdir: Path, log=print) -> dict:
    import redis as redis_py

    from bench.harness.servers import stop_process
    from bench.vegeta import cpu_seconds
    from throwaway import feast_venv
    from throwaway.servers import start_redis

    feast_venv.ensure()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    began = time.perf_counter()
    server = start_redis(workdir / "redis", "--maxmemory", "1gb", "--logfile", str(workdir / "redis" / "redis.log"))
    subprocess.run(["taskset", "-p", "-c", LOAD_CPU, str(server.process.pid)], check=True, stdout=subprocess.DEVNULL)
    os.sched_setaffinity(0, {int(LOAD_CPU)})  # the client: this process
    servers: dict = {}
    try:
        repo = feast_repo(workdir / "feature_repo", server.port)
        log("feast apply and materialize import-feast of the same repository")
        apply = subprocess.Popen([str(feast_venv.feast()), "apply"], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        defs = our_definitions(repo, workdir / "defs")  # meanwhile
        if apply.wait() != 0:
            raise RuntimeError(f"feast apply failed ({apply.returncode}): {apply.stdout.read()[-3000:]}")
        log(f"  our definitions: {defs['by']}" + (f" ({defs['why']})" if "why" in defs else ""))
        conf = our_conf(workdir, workdir / "defs", f"redis://127.0.0.1:{server.port}/{OUR_DB}")
        servers = start_servers(workdir, repo, conf)
        setup_seconds = time.perf_counter() - began
        start = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(hours=3)
        bodies = plan(sizes, rounds, connections, start)
        totals = {"sent": 0, "written": 0, "kept_newer": 0}
        runs: dict = {}
        for n in sizes:
            todo = bodies["sizes"][n]
            runs[n] = {label: {"seconds": [], "cpu": [], "latencies": []} for label in ("ours", "feast")}
            for r, per_connection in enumerate([todo["warm"], *todo["rounds"]]):
                for label in ("ours", "feast") if r % 2 == 0 else ("feast", "ours"):
                    process = servers[label]["process"]
                    cpu = cpu_seconds(process.pid)
                    seconds, latencies, answers, failures = drive(servers[label]["port"], per_connection)
                    cpu = cpu_seconds(process.pid) - cpu
                    if failures:
                        raise RuntimeError(f"{label}: pushes of {n} rows failed: {failures[:3]}")
                    if label == "ours":
                        count_written(answers, totals)
                        totals["sent"] += len(answers) * n
                    if r == 0:
                        continue  # the warm-up
                    runs[n][label]["seconds"].append(seconds)
                    runs[n][label]["cpu"].append(cpu)
                    runs[n][label]["latencies"].extend(latencies)
            line = []
            for label in ("ours", "feast"):
                got = runs[n][label]
                lat = got["latencies"]
                line.append(f"{label} {len(lat) * n / sum(got['seconds']):,.0f} rows/s, p50 {percentile(lat, 0.5) * 1e3:.1f} ms, "
                            f"p99 {percentile(lat, 0.99) * 1e3:.1f} ms, {sum(got['cpu']) / len(lat) * 1e3:.1f} ms CPU a push")  # fmt: skip
            log(f"  {n:>3} rows a push: " + "; ".join(line))
        drivers = sorted(bodies["last"])
        sample = drivers[:: max(1, len(drivers) // SAMPLE)][:SAMPLE]
        read = {label: read_back(servers[label]["port"], sample) for label in ("ours", "feast")}
        ours_db, feast_db = (redis_py.Redis(port=server.port, db=db) for db in (OUR_DB, FEAST_DB))
        keys = {"ours": ours_db.dbsize(), "feast": feast_db.dbsize()}
        our_entity_keys = sum(1 for _ in ours_db.scan_iter(match=f"{PREFIX}:*", count=1000))
    finally:
        for s in servers.values():
            stop_process(s["process"])
        server.stop()

    results: dict = {}
    for n, by in runs.items():
        row: dict = {"rows_per_push": n, "pushes_per_server": len(by["ours"]["latencies"])}
        for label, got in by.items():
            lat, per_round = got["latencies"], len(got["latencies"]) // len(got["seconds"])
            row[label] = {
                "rows_per_s": round(len(lat) * n / sum(got["seconds"]), 1),
                "pushes_per_s": round(len(lat) / sum(got["seconds"]), 1),
                "p50_ms": round(percentile(lat, 0.5) * 1e3, 2),
                "p99_ms": round(percentile(lat, 0.99) * 1e3, 2),
                "mean_ms": round(statistics.fmean(lat) * 1e3, 2),
                "server_cpu_ms_per_push": round(sum(got["cpu"]) / len(lat) * 1e3, 2),
                "server_cpu_us_per_row": round(sum(got["cpu"]) / (len(lat) * n) * 1e6, 1),
                "rows_per_s_by_round": [round(per_round * n / s, 1) for s in got["seconds"]],
            }
        o, f = row["ours"], row["feast"]
        row["ours_over_feast"] = {
            "rows_per_s": round(o["rows_per_s"] / f["rows_per_s"], 2),
            "rows_per_s_median_of_rounds": round(
                statistics.median(a / b for a, b in zip(o["rows_per_s_by_round"], f["rows_per_s_by_round"])), 2
            ),
            "p50": round(o["p50_ms"] / f["p50_ms"], 2),
            "p99": round(o["p99_ms"] / f["p99_ms"], 2),
            "server_cpu_per_row": round(o["server_cpu_us_per_row"] / f["server_cpu_us_per_row"], 2),
        }
        results[str(n)] = row
    pushed = len(bodies["last"])
    checks = {
        "drivers_pushed": pushed,
        "keys": keys,
        "our_entity_keys": our_entity_keys,
        "every_driver_in_both": our_entity_keys == pushed and keys["feast"] == pushed,
        "our_rows_sent": totals["sent"],
        "our_rows_written": totals["written"],
        "our_rows_kept_as_newer": totals["kept_newer"],
        "sample_drivers": len(sample),
        "sample_last_values_equal": {label: all(same(bodies["last"][d], read[label][d]) for d in sample) for label in read},
    }
    checks["ok"] = (
        checks["every_driver_in_both"] and totals["written"] == totals["sent"] and all(checks["sample_last_values_equal"].values())
    )
    return {
        "date": dt.date.today().isoformat(),
        "peer": feast_venv.pinned().replace("feast==", "feast[redis]=="),
        "machine": f"{os.cpu_count()} cores shared with other jobs (load average {os.getloadavg()[0]:.1f} at the end); each server "
        f"pinned to CPU {SERVER_CPU}, the client and Redis to CPU {LOAD_CPU}",
        "connections": connections,
        "rounds": rounds,
        "warm_up_pushes": WARM_UP,
        "definitions": {k: v for k, v in defs.items() if k != "source_yaml"},
        "source_yaml": defs["source_yaml"],
        "setup_seconds": round(setup_seconds, 1),
        "seconds": round(time.perf_counter() - began, 1),
        "results": results,
        "checks": checks,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.push", description=__doc__.split("\n\n")[0])
    p.add_argument("--pushes", default=",".join(f"{n}:{k}" for n, k in PUSHES.items()),
                   help="rows per push:pushes per server, comma-separated (default %(default)s)")  # fmt: skip
    p.add_argument("--rounds", type=int, default=8, help="rounds per size, servers alternating (default 8)")
    p.add_argument("--connections", type=int, default=2, help="client connections, each sending its pushes one after the other (default 2)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench" / "push")
    p.add_argument("--output", type=Path, help="write the results here as JSON")
    args = p.parse_args(argv)
    try:
        sizes = {int(n): int(k) for n, k in (part.split(":") for part in args.pushes.split(",") if part.strip())}
    except ValueError:
        sizes = {}
    if not sizes or not 1 <= min(sizes) <= max(sizes) <= DRIVERS_PER_CONNECTION or min(sizes.values()) < args.rounds * args.connections:
        print(
            f"error: --pushes: expected N:PUSHES pairs, N from 1 to {DRIVERS_PER_CONNECTION} (distinct drivers a push) and PUSHES "
            f">= rounds x connections, got {args.pushes!r}",
            file=sys.stderr,
        )
        return 2
    result = measure(sizes, args.rounds, args.connections, args.workdir.resolve(), log=lambda m: print(m, flush=True))
    print()
    print(table(result))
    c = result["checks"]
    print(f"\nour definitions: {result['definitions']['by']}; drivers pushed {c['drivers_pushed']:,}; keys per database {c['keys']} "
          f"(ours: {c['our_entity_keys']:,} entity keys and the description); ours wrote {c['our_rows_written']:,} of "
          f"{c['our_rows_sent']:,} rows sent, kept {c['our_rows_kept_as_newer']} as newer; the last values pushed read back from "
          f"{c['sample_drivers']} drivers: {c['sample_last_values_equal']}")  # fmt: skip
    print(f"{result['machine']}; {result['seconds']:.0f} s in all ({result['setup_seconds']:.0f} s of setup)")
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.output}")
    return 0 if c["ok"] else 1


def table(result: dict) -> str:
    """The README's table: per size, rows/s, p50 and p99 of each server, and ours / Feast's."""
    lines = [
        "| rows a push | rows/s, ours | rows/s, Feast | ours / Feast | p50 ms, ours / Feast | p99 ms, ours / Feast "
        "| server CPU per row, ours / Feast |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, row in result["results"].items():
        o, f, x = row["ours"], row["feast"], row["ours_over_feast"]
        lines.append(
            f"| {n} | {o['rows_per_s']:,.0f} | {f['rows_per_s']:,.0f} | {x['rows_per_s']:.2f}x | {o['p50_ms']:.1f} / {f['p50_ms']:.1f} "
            f"| {o['p99_ms']:.1f} / {f['p99_ms']:.1f} | {o['server_cpu_us_per_row']:,.0f} / {f['server_cpu_us_per_row']:,.0f} us "
            f"({x['server_cpu_per_row']:.2f}x) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
