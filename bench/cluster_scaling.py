"""`make bench-cluster`: how the Redis write scales with writers (executors) and primaries.

One script, one machine, every figure a ratio to the baseline measured in the same run:
the standard shape (:mod:`bench.standard`) is made once in Spark and kept as Arrow; then,
for each setting, fresh Redis servers are started on loopback and ``writers`` processes
(each standing for a Spark task) encode and write their share exactly as
:func:`sinks.partition.write_partition` does. Settings: a plain redis-server
with the standalone sink (the baseline), Redis Cluster with 1, 2 and 3 primaries, and 3
primaries with a replica each, with and without ``wait_replicas: 1``, and many primaries
(``--many``) written as the writer does, every primary's share in flight at once, against
one primary after another.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from fm_config import PROJECT_ROOT

PREFIX = "b:"


def _make_data(path: Path, entities: int) -> None:
    """The standard shape as the writers see it (_id and the feature columns), in 10k-row batches."""
    from pyspark.sql import functions as F

    from bench.standard import standard_frame
    from fm_config import SparkConf
    from jobs.spark import build_spark

    spark = build_spark(SparkConf(master="local[2]", app_name="bench-cluster"))
    try:
        frame = standard_frame(spark, entities)
        features = [c for c in frame.columns if c not in ("entity_id", "ds")]
        table = frame.select(F.col("entity_id").cast("string").alias("_id"), *features).toArrow().combine_chunks()
    finally:
        spark.stop()
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=10_000):
            writer.write_batch(batch)


def _specs():
    """The standard source's feature specs, from its definitions as the job loads them."""
    from bench.standard import SOURCE, write_definitions
    from feature_defs import load_definitions
    from jobs.transforms import feature_specs

    with tempfile.TemporaryDirectory() as folder:
        return list(feature_specs(load_definitions(write_definitions(Path(folder))).sources[SOURCE]))


def _writer(data: str, part: int, parts: int, url: str, cluster: bool, wait_replicas: int, parallel: bool, start, results) -> None:
    """One writer (a Spark task): its share of the batches, encoded and written; timed from the common start."""
    from serializers.batch import encode_batch
    from serializers.scalar import field_id
    from sinks.redis.cluster import RedisClusterSink
    from sinks.redis.config import RedisSinkConfig
    from sinks.redis.node import RedisSink

    specs = _specs()
    reader = pa.ipc.open_file(pa.memory_map(data))
    batches = [reader.get_batch(i) for i in range(part, reader.num_record_batches, parts)]
    config = RedisSinkConfig(
        url=url,
        key_prefix=PREFIX,
        fields=tuple(field_id(s.name) for s in specs),
        freshness_field=field_id("_ts:bench_standard"),
        as_of=1_763_596_800,
        chunk_entities=500,
        cluster=cluster,
        wait_replicas=wait_replicas,
    )
    start.wait()
    began, cpu = time.perf_counter(), time.process_time()
    sink = RedisClusterSink(config, parallel=parallel) if cluster else RedisSink(config)
    with sink:
        for batch in batches:
            sink.write_batch(encode_batch(batch, specs))
    results.put({"part": part, "seconds": time.perf_counter() - began, "cpu": time.process_time() - cpu, "entities": sink.stats.entities})


def _server_cpu(ports: list[int]) -> float:
    """CPU seconds the servers have used (INFO cpu, main thread and children)."""
    import redis

    total = 0.0
    for port in ports:
        info = redis.Redis(port=port).info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def _measure(data: Path, url: str, ports: list[int], cluster: bool, writers: int, wait_replicas: int = 0, parallel: bool = True) -> dict:
    ctx = mp.get_context("spawn")
    start, results = ctx.Barrier(writers + 1), ctx.Queue()
    procs = [
        ctx.Process(target=_writer, args=(str(data), i, writers, url, cluster, wait_replicas, parallel, start, results))
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    server_cpu = _server_cpu(ports)
    start.wait()
    began = time.perf_counter()
    out = [results.get(timeout=600) for _ in procs]
    seconds = time.perf_counter() - began
    server_cpu = _server_cpu(ports) - server_cpu
    for p in procs:
        p.join()
        if p.exitcode:
            raise RuntimeError(f"a writer failed (exit {p.exitcode})")
    entities = sum(r["entities"] for r in out)
    return {
        "seconds": seconds,
        "entities": entities,
        "entities_per_s": entities / seconds,
        # CPU per million entities: what sizing divides by (the cores each side needs)
        "writer_cpu_s_per_m": sum(r["cpu"] for r in out) / entities * 1e6,
        "redis_cpu_s_per_m": server_cpu / entities * 1e6,
    }


def run(entities: int, writers: list[int], repeats: int, workdir: Path, output: Path | None, many: int = 8) -> dict:
    from throwaway.cluster import start_cluster
    from throwaway.servers import start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / f"standard-{entities}.arrow"
    if not data.exists():
        print(f"bench-cluster: making {entities:,} entities of the standard shape ...", flush=True)
        _make_data(data, entities)
    settings = (
        [("standalone", 1, 0, 0, True)]
        + [("cluster", n, 0, 0, True) for n in (1, 2, 3)]
        + [("cluster", 3, 1, 0, True), ("cluster", 3, 1, 1, True)]
    )
    # many primaries: every share in flight at once (the writer's way) against one primary after another
    settings += [("cluster", many, 0, 0, False), ("cluster", many, 0, 0, True)]
    rows = []
    for kind, primaries, replicas, wait, parallel in settings:
        for w in writers:
            best = None
            for _ in range(repeats):  # fresh servers each time: every run writes new keys
                if kind == "standalone":
                    (workdir / "standalone").mkdir(exist_ok=True)
                    server = start_redis(workdir / "standalone", "--hash-max-listpack-value", "256")
                    url, ports, stop = server.url, [server.port], server.stop
                else:
                    cluster = start_cluster(
                        workdir / f"cluster-{primaries}-{replicas}", primaries, replicas, "--hash-max-listpack-value", "256"
                    )
                    url, ports, stop = cluster.url, cluster.ports, cluster.stop
                try:
                    result = _measure(data, url, ports, kind == "cluster", w, wait, parallel)
                finally:
                    stop()
                if best is None or result["entities_per_s"] > best["entities_per_s"]:
                    best = result
            row = {
                "setting": kind,
                "primaries": primaries,
                "replicas_each": replicas,
                "wait_replicas": wait,
                "parallel": parallel,
                "writers": w,
                **best,
            }
            print(
                f"  {kind:10} primaries={primaries} replicas={replicas} wait={wait} "
                f"{'parallel' if parallel else 'one by one'} writers={w}: {best['entities_per_s']:>9,.0f} entities/s",
                flush=True,
            )
            rows.append(row)
    base = next(r for r in rows if r["setting"] == "standalone" and r["writers"] == writers[0])
    for r in rows:
        r["ratio_to_baseline"] = r["entities_per_s"] / base["entities_per_s"]
    report = {
        "command": f"python -m bench.cluster_scaling --entities {entities} --writers {','.join(map(str, writers))} --many {many}",
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "entities": entities,
        "values_per_entity": len(_specs()),
        "baseline": f"standalone redis-server, {writers[0]} writer(s)",
        "results": rows,
    }
    print(
        f"\n{'setting':<38} {'writers':>7} {'entities/s':>11} {'values/s':>11} "
        f"{'x baseline':>10} {'writer CPU s/M':>14} {'Redis CPU s/M':>13}"
    )
    for r in rows:
        name = (
            "redis-server (standalone sink)"
            if r["setting"] == "standalone"
            else f"cluster {r['primaries']} primaries"
            + (f" +{r['replicas_each']} replica" + (" WAIT 1" if r["wait_replicas"] else "") if r["replicas_each"] else "")
            + ("" if r["parallel"] else ", one after another")
        )
        print(
            f"{name:<38} {r['writers']:>7} {r['entities_per_s']:>11,.0f} {r['entities_per_s'] * report['values_per_entity']:>11,.0f} "
            f"{r['ratio_to_baseline']:>10.2f} {r['writer_cpu_s_per_m']:>14.1f} {r['redis_cpu_s_per_m']:>13.1f}"
        )
    if output:
        output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {output}")
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.cluster_scaling", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=200_000, help="entities written per setting (default: 200000)")
    p.add_argument("--writers", default="1,2", help="comma-separated writer counts, each a process like a Spark task (default: 1,2)")
    p.add_argument("--repeats", type=int, default=2, help="runs per setting, the best kept (default: 2)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench-cluster")
    p.add_argument("--many", type=int, default=8, help="primaries of the many-primaries rows (default: 8)")
    p.add_argument("--output", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    run(args.entities, [int(w) for w in args.writers.split(",")], args.repeats, args.workdir.resolve(), args.output, args.many)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
