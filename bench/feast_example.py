"""Feast's own example, scaled: `feast materialize` and `materialize run` on the same repository.

    python -m bench.feast_example [--entities 1000000] [--rows-per-entity 3] [--warm 2] [--output FILE]

`feast init` writes Feast's driver-stats repository (Feast 0.67, pinned in its own venv:
throwaway/feast_venv.py). Its `data/driver_stats.parquet` is scaled to ``--entities``
drivers, each with ``--rows-per-entity`` hourly rows ending at the example's last hour
(values drawn from the example's own rows, seeded; Feast's file schema kept, nanosecond
timestamps and the Map, Json and Struct columns included), so both tools pick each
driver's latest row by event time. `materialize import-feast` writes this project's
definitions from the repository; the repository's online store becomes a throwaway
redis-server, database 1 for Feast and 0 for this project.

Then, in this order and on the same server: `feast apply` (untimed), `feast materialize`
over every row, and `materialize run --date <the last row's date> --sink redis`, each
timed as a whole process, as a user would time it (this project's includes its JVM and
the data-quality gate). Both materialize both feature views of the example
(`driver_hourly_stats` and `driver_hourly_stats_fresh`, read from the same file). The
keys each wrote are counted and the Redis memory each added is measured.

Last, ``--warm`` more runs of ours in one process after a first (database 0 emptied and the
ledger removed before each, so each writes everything): the same work in a JVM whose
code is compiled already, with the JVM's JIT compilation time of each run. On this 2-core
machine the compiler threads share the cores with Spark's tasks; the difference between
the first run and the next ones is what a fresh process pays for it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.confs import bench_conf, redis_only
from fm_config import PROJECT_ROOT

HERE = Path(__file__).parent
ENV = "feast_example"
FEAST_DB, OUR_DB = 1, 0
VIEWS = ("driver_hourly_stats", "driver_hourly_stats_fresh")
BATCH_ROWS = 10_000
"""Feast's ``materialization.online_write_batch_size``: without it Feast 0.67 writes all
rows in one batch (bench/harness/feast.py)."""


def feast(repo: Path, *args: str, timed: bool = False) -> float:
    from throwaway import feast_venv

    start = time.perf_counter()
    done = subprocess.run([str(feast_venv.feast()), *args], cwd=repo, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"feast {' '.join(args)} failed ({done.returncode}): {done.stdout[-1000:]}{done.stderr[-3000:]}")
    return seconds if timed else 0.0


def init_repo(workdir: Path) -> Path:
    """A fresh `feast init` of Feast's example; its feature repository's folder."""
    shutil.rmtree(workdir / "demo", ignore_errors=True)
    workdir.mkdir(parents=True, exist_ok=True)
    feast(workdir, "init", "demo")
    return workdir / "demo" / "feature_repo"


def scale(parquet: Path, entities: int, rows_per_entity: int, seed: int = 40) -> dict:
    """Rewrite Feast's example file with ``entities`` drivers (ids from 1001), each with
    ``rows_per_entity`` hourly rows ending at the example's last event time, their values
    taken from random rows of the example itself. Returns what was written."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    example = pq.read_table(parquet)
    ts_type = example.schema.field("event_timestamp").type
    last = pc.max(example["event_timestamp"]).as_py()
    rows = entities * rows_per_entity
    rng = np.random.default_rng(seed)
    scaled = example.take(pa.array(rng.integers(0, example.num_rows, rows)))
    drivers = np.repeat(np.arange(1001, 1001 + entities, dtype=np.int64), rows_per_entity)
    hours_back = np.tile(np.arange(rows_per_entity, dtype=np.int64), entities)
    last_ns = int(pa.scalar(last, ts_type).cast(pa.int64()).as_py())
    unit = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}[ts_type.unit]
    stamps = (last_ns - hours_back * 3600 * 10**9) // unit
    for name, values in (("driver_id", pa.array(drivers, example.schema.field("driver_id").type)),
                         ("event_timestamp", pa.array(stamps, pa.int64()).cast(ts_type))):  # fmt: skip
        scaled = scaled.set_column(scaled.schema.get_field_index(name), name, values)
    pq.write_table(scaled.replace_schema_metadata(example.schema.metadata), parquet)
    return {
        "rows": rows,
        "entities": entities,
        "rows_per_entity": rows_per_entity,
        "last_event_time": last.isoformat() if hasattr(last, "isoformat") else str(last),
        "parquet_bytes": parquet.stat().st_size,
        "example_rows": example.num_rows,
    }


def point_at(repo: Path, port: int) -> None:
    """The repository's online store: database FEAST_DB of the throwaway redis-server."""
    yaml_path = repo / "feature_store.yaml"
    settings = yaml_path.read_text()
    online = settings.index("online_store:")
    end = settings.index("\n", settings.index("path:", online))
    store = f'online_store:\n    type: redis\n    connection_string: "127.0.0.1:{port},db={FEAST_DB}"'
    batch = f"\nmaterialization:\n    online_write_batch_size: {BATCH_ROWS}\n"
    yaml_path.write_text(settings[:online] + store + settings[end:] + batch)


def our_conf(workdir: Path, defs: Path, redis_url: str) -> Path:
    """A config folder: the project's conf/base and an env of this bench's own."""
    return bench_conf(
        workdir,
        ENV,
        redis_only(workdir, defs, redis_url)
        # as conf/local (the embedded default) runs Spark on this machine
        + "spark:\n  master: local[2]\n  shuffle_partitions: 4\n  arrow_batch_rows: 5000\n  max_partition_bytes: 16m\n"
        "  driver_memory: 4g\n",
    )


def used_memory(client) -> int:
    return int(client.info("memory")["used_memory"])


def in_one_process(workdir: Path, env: dict, date: dt.date, warm: int) -> list[dict]:
    """``warm`` + 1 runs of ours in one child process (:func:`runs_in_one_process`)."""
    out = workdir / "in-one-process.json"
    cmd = [sys.executable, "-m", "bench.feast_example", "--in-one-process", f"{date.isoformat()},{warm + 1},{out}"]
    print(f"{warm + 1} runs of ours in one process ...", flush=True)
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=PROJECT_ROOT)
    runs = json.loads(out.read_text())
    for i, r in enumerate(runs):
        print(f"  run {i + 1}: {r['seconds']:.1f} s, JIT compilation {r['jit_compile_s']:.1f} s", flush=True)
    return runs


def runs_in_one_process(spec: str) -> None:
    """The child of :func:`in_one_process`: ``date,runs,output``; the env's conf is the bench's."""
    import redis
    from pyspark.sql import SparkSession

    from fm_config import load_config
    from jobs.cli import main as materialize

    date, runs, out = spec.split(",")
    conf = load_config()
    runs_done = []
    for _ in range(int(runs)):
        redis.Redis.from_url(conf.redis.url).flushdb()
        for folder in (conf.data_root, conf.reports_dir):
            shutil.rmtree(folder, ignore_errors=True)
        spark = SparkSession.getActiveSession()
        compiled = lambda s: s._jvm.java.lang.management.ManagementFactory.getCompilationMXBean().getTotalCompilationTime() if s else 0  # noqa: E731
        jit = compiled(spark)
        start = time.perf_counter()
        if materialize(["run", "--date", date, "--sink", "redis"]) != 0:
            raise RuntimeError("materialize run failed in the warm loop")
        seconds = time.perf_counter() - start
        jit = (compiled(SparkSession.getActiveSession()) - jit) / 1000
        runs_done.append({"seconds": round(seconds, 2), "jit_compile_s": round(jit, 1)})
    Path(out).write_text(json.dumps(runs_done))


def measure(entities: int, rows_per_entity: int, workdir: Path, warm: int = 0) -> dict:
    import redis

    from throwaway import feast_venv
    from throwaway.servers import start_redis

    feast_venv.ensure()
    shutil.rmtree(workdir, ignore_errors=True)
    repo = init_repo(workdir)
    print(f"scaling {repo / 'data' / 'driver_stats.parquet'} to {entities:,} drivers x {rows_per_entity} rows", flush=True)
    data = scale(repo / "data" / "driver_stats.parquet", entities, rows_per_entity)

    defs = workdir / "defs"
    start = time.perf_counter()
    subprocess.run(
        [str(PROJECT_ROOT / ".venv" / "bin" / "materialize"), "import-feast", str(repo), "--out", str(defs),
         "--feast-python", str(feast_venv.python())],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    import_seconds = time.perf_counter() - start

    # the standard bench's server settings (bench/runner.py), with a maxmemory for the job's capacity check
    server = start_redis(
        workdir / "redis", "--hash-max-listpack-value", "256", "--maxmemory", "8gb", "--logfile", str(workdir / "redis" / "redis.log")
    )
    try:
        base = f"redis://127.0.0.1:{server.port}"
        point_at(repo, server.port)
        ours, theirs = redis.Redis(port=server.port, db=OUR_DB), redis.Redis(port=server.port, db=FEAST_DB)
        theirs.flushall()
        feast(repo, "apply")

        before = used_memory(theirs)
        end = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
        print(f"feast materialize 2000-01-01T00:00:00 {end} ...", flush=True)
        feast_seconds = feast(repo, "materialize", "2000-01-01T00:00:00", end, timed=True)
        feast_memory = used_memory(theirs) - before
        feast_keys = theirs.dbsize()
        print(f"  {feast_seconds:.1f} s, {feast_keys:,} keys", flush=True)

        date = dt.date.fromisoformat(data["last_event_time"][:10])
        conf = our_conf(workdir, defs, f"{base}/{OUR_DB}")
        env = dict(os.environ, FM_CONF_DIR=str(conf), FM_ENV=ENV)
        cmd = [str(PROJECT_ROOT / ".venv" / "bin" / "materialize"), "run", "--date", date.isoformat(), "--sink", "redis"]
        print(" ".join(["materialize", *cmd[1:]]) + " ...", flush=True)
        before = used_memory(ours)
        start = time.perf_counter()
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=PROJECT_ROOT)
        our_seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"materialize run failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-3000:]}")
        our_memory = used_memory(ours) - before
        our_keys = ours.dbsize()
        print(f"  {our_seconds:.1f} s, {our_keys:,} keys", flush=True)
        in_one = in_one_process(workdir, env, date, warm) if warm else []
    finally:
        server.stop()

    values = entities * len(VIEWS) * 6  # six features per view, one row per driver each
    return {
        "peer": feast_venv.pinned(),
        "data": data,
        "import_seconds": round(import_seconds, 2),
        "feast": {
            "seconds": round(feast_seconds, 2),
            "keys": feast_keys,
            "redis_bytes": feast_memory,
            "online_write_batch_size": BATCH_ROWS,
        },
        "ours": {"seconds": round(our_seconds, 2), "keys": our_keys, "redis_bytes": our_memory, "summary": done.stdout[-4000:]},
        "values": values,
        "feast_over_ours": round(feast_seconds / our_seconds, 2),
        "in_one_process": in_one,
        "feast_over_ours_warm": round(feast_seconds / min(r["seconds"] for r in in_one[1:]), 2) if in_one[1:] else None,
        "memory_ours_over_feast": round(our_memory / feast_memory, 3) if feast_memory else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.feast_example", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=1_000_000, help="drivers (default 1,000,000)")
    p.add_argument("--rows-per-entity", type=int, default=3, help="hourly rows per driver (default 3)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench" / "feast-example")
    p.add_argument("--output", type=Path, default=HERE / "results" / "feast_example.json")
    p.add_argument("--warm", type=int, default=2, help="runs of ours after a first in one process (default 2; 0: none)")
    p.add_argument("--in-one-process", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.in_one_process:
        runs_in_one_process(args.in_one_process)
        return 0
    result = measure(args.entities, args.rows_per_entity, args.workdir.resolve(), args.warm)
    f, o = result["feast"], result["ours"]
    print(f"\n| {result['data']['entities']:,} drivers x {result['data']['rows_per_entity']} rows | seconds | keys | Redis MiB |")
    print("|---|---:|---:|---:|")
    print(f"| feast materialize ({result['peer']}) | {f['seconds']:.1f} | {f['keys']:,} | {f['redis_bytes'] / 2**20:,.1f} |")
    print(f"| materialize run | {o['seconds']:.1f} | {o['keys']:,} | {o['redis_bytes'] / 2**20:,.1f} |")
    print(f"\nFeast's whole process / ours: {result['feast_over_ours']}x; import-feast {result['import_seconds']} s")
    if result["feast_over_ours_warm"]:
        print(f"Feast's whole process / ours in a JVM that ran it before: {result['feast_over_ours_warm']}x")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
