"""`python -m bench`: the real job on the standard shape, side by side with its baselines.

The parent starts a throwaway redis-server (``hash-max-listpack-value 256``), then runs
each size in a child process of its own (a fresh JVM, so each peak RSS belongs to that
size): write the Delta table (kept for the next bench), run the job end to end into
Redis (and, for the first size, the SQL store), read the memory figures. The first
size also measures, on a sample of the same data, the baselines (:mod:`bench.baselines`),
encoding alone and a cProfile of the Redis write path. The parent prints one table and
writes everything as JSON; every target is a ratio within this one run.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from urllib.parse import unquote, urlparse

from fm_config import PROJECT_ROOT
from sinks.redis.config import redis_sink_config
from sinks.sql.config import sql_sink_config
from throwaway.servers import start_redis

FEAST_VALUES_PER_S = 74_000
"""`feast materialize` into Redis on this kind of machine (measured once, see bench/README.md)."""
SAMPLE_ENTITIES = 100_000
"""Entities the baselines load (the same rows the job wrote)."""
REDIS_PY_ENTITIES = 20_000
SQL_SWEEP_ROWS = 50_000
SQL_MAX_ENTITIES = 1_000_000
"""The SQL path and its baselines run at the largest size up to this (the raw loaders hold its rows in memory)."""


# ---------------------------------------------------------------- child: one size


def _jvm_peak_rss() -> int:
    """VmHWM of the JVM this process started (local mode: driver and executor in one)."""
    import psutil

    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.name() == "java":
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (psutil.Error, OSError):
            continue
    return 0


def _bench_conf(env: str, workdir: Path, entities: int, redis_url: str, with_sql: bool):
    from fm_config import load_config

    return load_config(
        env,
        {
            "data_root": str(workdir / "data" / str(entities)),
            "reports_dir": str(workdir / "reports"),
            "definitions_dir": str(workdir / "defs"),
            "sinks": ["redis", "sql"] if with_sql else ["redis"],
            # the gate and the read-back have their own costs; this measures the write path
            "quality": {"expectations": False, "verify_sample": 0, "row_count_band": None, "data_docs": False},
            "redis": {"url": redis_url, "password_env": None, "capacity_bytes": 64 << 30, "namespace": None},
            # two writer tasks at a time on the 2-core machine; more partitions as the size grows
            "spark": {"master": "local[2]", "shuffle_partitions": 2, "arrow_batch_rows": 10_000},
        },
    )


def _sample(spark, conf, source, limit: int):
    """The first ``limit`` entities as the writers see them (_id and feature columns), in 10k-row batches."""
    from pyspark.sql import functions as F

    from jobs.pipeline.read import source_path

    df = spark.read.format("delta").load(source_path(conf, source)).orderBy("entity_id").limit(limit)
    table = df.select(F.col("entity_id").cast("string").alias("_id"), *[f.name for f in source.features]).toArrow()
    return table.combine_chunks().to_batches(max_chunksize=10_000)


def _profile_summary(profiler: cProfile.Profile, top: int = 15) -> list[dict]:
    stats = pstats.Stats(profiler, stream=io.StringIO())
    total = sum(entry[2] for entry in stats.stats.values()) or 1.0
    rows = sorted(stats.stats.items(), key=lambda item: item[1][2], reverse=True)[:top]
    out = []
    for (filename, line, name), (_cc, calls, tottime, cumtime, _callers) in rows:
        where = filename.replace(str(PROJECT_ROOT) + "/", "")
        where = where.split("site-packages/")[-1]
        out.append(
            {
                "function": f"{where}:{line}({name})",
                "calls": calls,
                "tottime_s": round(tottime, 4),
                "cumtime_s": round(cumtime, 4),
                "share": round(tottime / total, 3),
            }
        )
    return out


def _sql_sink_rate(conf, source, entity, keys: list[str], docs: list[str], per_transaction: int) -> float:
    from bench.standard import DATE
    from sinks.sql.preflight import ensure_schema
    from sinks.sql.upserts import SqlSink
    from stores.sql import connect

    sink_conf = replace(sql_sink_config(conf, source, entity, DATE), table="bench_sink_sweep", statements_per_transaction=per_transaction)
    with connect(sink_conf) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_sink_sweep")
        ensure_schema(conn, sink_conf)
    import pyarrow as pa

    key_array, doc_array = pa.array(keys), pa.array(docs)
    start = time.perf_counter()
    with SqlSink(sink_conf) as sink:
        for first in range(0, len(keys), 10_000):  # Arrow batches, as the partition writer sends them
            sink.write_batch(key_array.slice(first, 10_000), doc_array.slice(first, 10_000))
        sink.flush()
    return len(keys) / (time.perf_counter() - start)


def _baselines(spark, conf, defs, source, entity, redis_url: str, workdir: Path) -> dict:
    import pyarrow as pa
    import pyarrow.compute as pc
    import redis

    from bench import baselines
    from bench.standard import DATE
    from jobs.transforms import feature_specs
    from serializers.batch import encode_batch
    from serializers.keys import as_of_epoch
    from serializers.resp import entity_commands
    from sinks.partition import write_partition
    from sinks.redis.writer import RedisWritePlan

    specs = list(feature_specs(source))
    batches = _sample(spark, conf, source, SAMPLE_ENTITIES)
    entities = sum(b.num_rows for b in batches)
    values = entities * len(specs)
    sink = redis_sink_config(conf, source, entity, DATE)
    prefix = sink.key_prefix.encode()
    out: dict = {"sample_entities": entities}

    # encoding alone, one core: feature values, then the RESP commands
    start = time.perf_counter()
    encoded = [encode_batch(b, specs) for b in batches]
    out["encode_values_per_s"] = values / (time.perf_counter() - start)
    start = time.perf_counter()
    commands = []
    for e in encoded:
        keys = pc.binary_join_element_wise(prefix, e.ids.cast(pa.binary()), b"")
        commands.append(
            entity_commands(keys, e.columns, sink.fields, sink.freshness_field, str(as_of_epoch(DATE)).encode(), horizon=sink.horizon)
        )
    out["resp_values_per_s"] = values / (time.perf_counter() - start)
    written = sum(int(c.values_set.sum()) for c in commands)

    client = redis.Redis.from_url(redis_url)
    try:
        # the server's ceiling: the same bytes, pre-built, one process
        client.flushall()
        before = int(client.info("memory")["used_memory"])
        seconds = baselines.raw_load(redis_url, commands)
        out["ceiling_values_per_s"] = written / seconds
        out["ceiling_keys_per_s"] = entities / seconds
        out["bytes_per_value_256"] = (int(client.info("memory")["used_memory"]) - before) / written
        # the same payload with Redis's default 64-byte listpack limit
        client.flushall()
        client.config_set("hash-max-listpack-value", 64)
        before = int(client.info("memory")["used_memory"])
        baselines.raw_load(redis_url, commands)
        out["bytes_per_value_default"] = (int(client.info("memory")["used_memory"]) - before) / written
        client.config_set("hash-max-listpack-value", 256)

        # a client library building the commands: redis-py pipeline with hiredis
        client.flushall()
        n = min(REDIS_PY_ENTITIES, entities)
        cols = [sum((e.columns[j].to_pylist() for e in encoded), [])[:n] for j in range(len(specs))]
        ids = sum((e.ids.to_pylist() for e in encoded), [])[:n]
        keys = [prefix + i.encode() for i in ids]
        rows = [{f: col[i] for f, col in zip(sink.fields, cols) if col[i] is not None} for i in range(n)]
        py_values = sum(len(r) for r in rows)
        out["redis_py_values_per_s"] = py_values / baselines.redis_py_load(redis_url, keys, rows)

        # pipeline depth and Arrow batch size: the write path alone (one process), by setting
        def write_rate(chunk: int, batch_rows: int) -> float:
            client.flushall()
            plan = RedisWritePlan(sink=replace(sink, chunk_entities=chunk), features=tuple(specs))
            table = pa.Table.from_batches(batches).combine_chunks()
            start = time.perf_counter()
            list(write_partition(plan, iter(table.to_batches(max_chunksize=batch_rows))))
            return values / (time.perf_counter() - start)

        out["tuning"] = {
            "pipeline_entities": {str(chunk): write_rate(chunk, 10_000) for chunk in (50, 200, 500, 2000)},
            "arrow_batch_rows": {str(rows): write_rate(500, rows) for rows in (1000, 5000, 10_000, 50_000)},
        }

        # where the write path spends its time (the partition function, in this process)
        client.flushall()
        plan = RedisWritePlan(sink=sink, features=tuple(specs))
        profiler = cProfile.Profile()
        start = time.perf_counter()
        profiler.enable()
        list(write_partition(plan, iter(batches)))
        profiler.disable()
        out["profiled_values_per_s"] = values / (time.perf_counter() - start)
        out["profile"] = _profile_summary(profiler)
        client.flushall()
    finally:
        client.close()

    return out


def _sql_baselines(spark, conf, source, entity, workdir: Path) -> dict:
    """Raw psycopg loaders and the sink alone, on this size's own rows as JSON documents."""
    import pyarrow.dataset as ds

    from bench import baselines
    from jobs.pipeline.read import source_path
    from jobs.transforms import feature_specs
    from serializers.json_map import encode_json_maps

    specs = list(feature_specs(source))
    # the table's live files (from the Delta log), read here without the JVM
    files = [unquote(urlparse(f).path) for f in spark.read.format("delta").load(source_path(conf, source)).inputFiles()]
    keys: list[str] = []
    docs: list[str] = []
    columns = ["entity_id", *[f.name for f in source.features]]
    for batch in ds.dataset(files, format="parquet").to_batches(columns=columns, batch_size=10_000):
        maps, _ = encode_json_maps(batch, specs)
        docs += maps.to_pylist()
        keys += [str(k) for k in batch.column("entity_id").to_pylist()]
    password = conf.sql_password()
    secret = password.get_secret_value() if password else None
    per_txn = conf.sql.statements_per_transaction
    out: dict = {"sql_rows": len(keys)}
    rows_done, seconds = baselines.raw_upsert(conf.sql.dsn, secret, keys, docs, workdir, parts=2, commit_every=per_txn)
    out["sql_raw_2_rows_per_s"] = rows_done / seconds
    rows_done, seconds = baselines.raw_upsert(conf.sql.dsn, secret, keys, docs, workdir, parts=1)
    out["sql_raw_rows_per_s"] = rows_done / seconds
    # the sink alone on one connection, by statements per transaction (1: commit each)
    order = sorted(range(len(keys)), key=keys.__getitem__)[:SQL_SWEEP_ROWS]
    sweep_keys, sweep_docs = [keys[i] for i in order], [docs[i] for i in order]
    out["sql_sink_rows_per_s"] = {str(k): _sql_sink_rate(conf, source, entity, sweep_keys, sweep_docs, k) for k in (1, per_txn, 100)}
    return out


def run_one_size(env: str, workdir: Path, entities: int, redis_url: str, with_sql: bool, with_baselines: bool) -> dict:
    import psycopg
    import redis
    from psycopg import sql as pgsql

    from bench.standard import DATE, SHAPE_VERSION, SOURCE, write_definitions, write_standard_table
    from feature_defs import load_definitions
    from jobs.pipeline.read import source_path
    from jobs.pipeline.run import run_source
    from jobs.spark import build_spark

    write_definitions(workdir / "defs")
    conf = _bench_conf(env, workdir, entities, redis_url, False)
    defs = load_definitions(conf.path(conf.definitions_dir))
    source = defs.source(SOURCE)
    entity = defs.entity_of(source)
    result: dict = {"entities": entities}
    spark = build_spark(conf.spark)
    try:
        table = Path(source_path(conf, source))
        marker, stamp = table / "_bench_rows", f"shape {SHAPE_VERSION}, {entities} entities"
        if not (marker.is_file() and marker.read_text() == stamp):
            start = time.perf_counter()
            write_standard_table(spark, table, entities)
            marker.write_text(stamp)
            result["table_write_seconds"] = time.perf_counter() - start
        client = redis.Redis.from_url(redis_url)
        client.flushall()
        client.close()
        summary = run_source(spark, conf, defs, SOURCE, DATE)
        if summary.status != "succeeded":
            raise RuntimeError(f"bench run failed: {summary.error}")
        r = summary.sinks["redis"]
        result |= {
            "values": r["values_set"],
            "run_seconds": summary.seconds,
            "redis_write_seconds": r["write_seconds"],
            "redis_values_per_s": r["values_per_s"],
            "redis_bytes_per_value": (r["memory_after"] - r["memory_before"]) / r["values_set"],
            "worker_peak_rss": r["worker_peak_rss"],
            "stages": summary.stages,
        }
        # peaks of the Redis run alone, so every size measures the same work
        result["jvm_peak_rss"] = _jvm_peak_rss()
        if with_sql:
            sql_conf = _bench_conf(env, workdir, entities, redis_url, True).model_copy(update={"sinks": ["sql"]})
            password = sql_conf.sql_password()
            with psycopg.connect(sql_conf.sql.dsn, password=password.get_secret_value() if password else None, autocommit=True) as conn:
                conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(entity.sql_table)))
            summary = run_source(spark, sql_conf, defs, SOURCE, DATE)
            if summary.status != "succeeded":
                raise RuntimeError(f"bench SQL run failed: {summary.error}")
            s = summary.sinks["sql"]
            result |= {"sql_rows": s["rows_upserted"], "sql_write_seconds": s["write_seconds"], "sql_rows_per_s": s["rows_per_s"]}
            result["sql_baselines"] = _sql_baselines(spark, sql_conf, source, entity, workdir)
        if with_baselines:
            result["baselines"] = _baselines(spark, conf, defs, source, entity, redis_url, workdir)
    finally:
        spark.stop()
    return result


# ---------------------------------------------------------------- parent


def _targets(sizes: list[dict]) -> list[dict]:
    first = sizes[0]
    base = first.get("baselines", {})
    rows = []

    def target(name: str, measured: float | None, goal: float, higher_is_better: bool = True, unit: str = "x") -> None:
        if measured is None:
            return
        ok = measured >= goal if higher_is_better else measured <= goal
        rows.append(
            {"target": name, "measured": round(measured, 3), "goal": f"{'>=' if higher_is_better else '<='} {goal}{unit}", "ok": ok}
        )

    # Throughput is judged at the largest size (steady state); every size's ratio is shown,
    # since small runs carry fixed Spark costs (starting the Python workers, scheduling).
    largest = sizes[-1]
    ceiling = base.get("ceiling_values_per_s")
    if ceiling and len(sizes) > 1:
        for s in sizes[:-1]:
            rows.append(
                {
                    "target": f"Redis path / server ceiling at {s['entities']:,} entities (shown)",
                    "measured": round(s["redis_values_per_s"] / ceiling, 3),
                    "goal": "-",
                    "ok": True,
                }
            )
    suffix = f" at {largest['entities']:,} entities"
    target("Redis path / server ceiling" + suffix, largest["redis_values_per_s"] / ceiling if ceiling else None, 0.5)
    target("Redis path / Feast (74k values/s)" + suffix, largest["redis_values_per_s"] / FEAST_VALUES_PER_S, 15)
    for s in sizes:
        target(
            f"Redis bytes per value (listpack 256) at {s['entities']:,} entities",
            s["redis_bytes_per_value"],
            16.5,
            higher_is_better=False,
            unit=" B",
        )
    target(
        "encoding alone, values/s per core (M)", base["encode_values_per_s"] / 1e6 if base.get("encode_values_per_s") else None, 5, unit="M"
    )
    for s in sizes:
        if "sql_baselines" not in s:
            continue
        sql_base, at = s["sql_baselines"], f" at {s['entities']:,} entities"
        target(
            "SQL path (2 partitions) / raw psycopg upserts (2 processes)" + at, s["sql_rows_per_s"] / sql_base["sql_raw_2_rows_per_s"], 0.8
        )
        rows.append(
            {
                "target": "SQL path (2 partitions) / raw psycopg upserts (1 connection, one commit; shown)" + at,
                "measured": round(s["sql_rows_per_s"] / sql_base["sql_raw_rows_per_s"], 3),
                "goal": "-",
                "ok": True,
            }
        )
    if len(sizes) > 1:
        small, large = sizes[0], sizes[-1]
        peak = lambda s: s["jvm_peak_rss"] + s["worker_peak_rss"]  # noqa: E731
        target(
            f"peak executor RSS, {large['entities']:,} / {small['entities']:,} entities",
            peak(large) / peak(small),
            1.25,
            higher_is_better=False,
        )
        per_value = lambda s: s["redis_write_seconds"] / s["values"]  # noqa: E731
        target(
            f"write time per value, {large['entities']:,} / {small['entities']:,} entities",
            per_value(large) / per_value(small),
            1.5,
            higher_is_better=False,
        )
    return rows


def _print_report(report: dict) -> None:
    mib = 1 << 20
    print(f"\nfeature-materializer bench ({report['machine']['cores']} cores, {report['machine']['python']})")
    print(
        f"{'entities':>10} {'values':>12} {'run s':>7} {'redis s':>8} {'values/s':>11} "
        f"{'B/value':>8} {'sql rows/s':>11} {'JVM peak':>9} {'worker peak':>11}"
    )
    for s in report["sizes"]:
        sql_rate = f"{s['sql_rows_per_s']:>11,.0f}" if "sql_rows_per_s" in s else f"{'-':>11}"
        print(
            f"{s['entities']:>10,} {s['values']:>12,} {s['run_seconds']:>7.1f} "
            f"{s['redis_write_seconds']:>8.1f} {s['redis_values_per_s']:>11,.0f} "
            f"{s['redis_bytes_per_value']:>8.2f} {sql_rate} {s['jvm_peak_rss'] / mib:>7.0f}Mi {s['worker_peak_rss'] / mib:>9.0f}Mi"
        )
    print("\nstage seconds of the Redis run (the summary's stages):")
    for s in report["sizes"]:
        print(f"{s['entities']:>10,}  " + ", ".join(f"{name} {sec:.1f}" for name, sec in s.get("stages", {}).items()))
    base = report["sizes"][0].get("baselines", {})
    if base:
        print(f"\nbaselines on {base['sample_entities']:,} of the same entities:")
        for key, label in [
            ("ceiling_values_per_s", "Redis server ceiling (pre-built RESP, one process)"),
            ("redis_py_values_per_s", "redis-py + hiredis pipeline"),
            ("encode_values_per_s", "encoding alone (one core)"),
            ("resp_values_per_s", "RESP command building alone (one core)"),
        ]:
            if key in base:
                print(f"  {label:<52} {base[key]:>14,.0f} /s")
        print(f"  {'bytes/value, default hash-max-listpack-value 64':<52} {base['bytes_per_value_default']:>14.2f}")
        print(f"  {'bytes/value, hash-max-listpack-value 256 (raw load)':<52} {base['bytes_per_value_256']:>14.2f}")
        for setting, rates in base.get("tuning", {}).items():
            print(f"  write path alone, one process, by {setting}: " + ", ".join(f"{k}: {v / 1e6:.2f}M/s" for k, v in rates.items()))
        for s in report["sizes"]:
            sql_base = s.get("sql_baselines")
            if sql_base:
                print(f"\nSQL baselines on the {sql_base['sql_rows']:,} rows of that size (rows/s):")
                print(f"  {'raw psycopg 25-row upserts, 2 processes, commits as the job':<52} {sql_base['sql_raw_2_rows_per_s']:>14,.0f}")
                print(f"  {'raw psycopg 25-row upserts, 1 connection, one commit':<52} {sql_base['sql_raw_rows_per_s']:>14,.0f}")
                rates = ", ".join(f"{k}: {v:,.0f}" for k, v in sql_base["sql_sink_rows_per_s"].items())
                print(f"  SQL sink alone, one connection, by statements per transaction: {rates}")
        print("\nwrite path profile (top functions by own time):")
        for row in base["profile"][:10]:
            print(f"  {row['share']:>6.1%} {row['tottime_s']:>8.3f}s {row['calls']:>8} {row['function']}")
    print("\ntargets:")
    for t in report["targets"]:
        verdict = "  -   " if t["goal"] == "-" else ("[ok]  " if t["ok"] else "[MISSED]")
        print(f"  {verdict} {t['target']}: {t['measured']}" + ("" if t["goal"] == "-" else f" (goal {t['goal']})"))


def run_bench(env: str, sizes: list[int], output: Path | None, workdir: Path | None, with_sql: bool = True) -> dict:
    workdir = (workdir or PROJECT_ROOT / ".run" / "bench").resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    # a throwaway server: no persistence, compact hashes up to 256-byte values (the embeddings)
    server = start_redis(workdir, "--hash-max-listpack-value", "256", "--logfile", str(workdir / "redis.log"))
    results = []
    # SQL at the largest size up to SQL_MAX_ENTITIES: fixed costs (starting workers, connecting) fade there
    sql_index = max((i for i, n in enumerate(sizes) if n <= SQL_MAX_ENTITIES), default=0)
    try:
        for index, entities in enumerate(sizes):
            print(f"bench: {entities:,} entities ...", flush=True)
            with tempfile.NamedTemporaryFile(suffix=".json", dir=workdir, delete=False) as tmp:
                out = Path(tmp.name)
            cmd = [sys.executable, "-m", "bench.runner", "--env", env, "--workdir", str(workdir), "--entities", str(entities)]
            cmd += ["--redis-url", server.url, "--json", str(out)]
            if index == 0:
                cmd += ["--baselines"]
            if with_sql and index == sql_index:
                cmd += ["--sql"]
            subprocess.run(cmd, check=True, cwd=PROJECT_ROOT)
            results.append(json.loads(out.read_text()))
            out.unlink()
    finally:
        server.stop()
    report = {
        "command": "python -m bench --entities " + ",".join(str(s) for s in sizes),
        "machine": {"cores": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "sizes": results,
        "targets": _targets(results),
    }
    _print_report(report)
    if output:
        output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {output}")
    return report


def main(argv: list[str] | None = None) -> int:
    """The child process of one size (see :func:`run_bench`)."""
    p = argparse.ArgumentParser(prog="python -m bench.runner")
    p.add_argument("--env", default="local")
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--entities", type=int, required=True)
    p.add_argument("--redis-url", required=True)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--baselines", action="store_true")
    p.add_argument("--sql", action="store_true")
    args = p.parse_args(argv)
    result = run_one_size(args.env, args.workdir, args.entities, args.redis_url, args.sql, args.baselines)
    args.json.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
