"""Where a whole run's time goes, per stage: `python -m bench.stage_profile`.

A stage's wall seconds less its Spark jobs' wall seconds (``job_wall_s``) is the driver's
own time: planning the queries, Delta's log, great-expectations, Python.

Runs the real job (`run_source`) as a user runs it (quality gate, data docs and the
read-back on, the `env`'s defaults otherwise) on standard-shape tables (bench/standard.py;
the long layout holds the same entities' 48 numbers as one row per (entity, feature)),
with Spark's event log on. Each pipeline stage tags its Spark jobs (local property
``fm.stage``, see jobs/pipeline/context.py), so the event log says, per stage: Spark jobs,
stages and tasks, executor run and CPU time, GC, shuffle and input bytes, beside the
stage's wall seconds from the run summary. Task time of the write stages includes the
Python writers (their own seconds are shown apart); elsewhere the work is the JVM's.

    python -m bench.stage_profile --entities 100000,1000000 --layout wide,long [--sinks redis|both]

Each (size, layout, sinks) runs in a fresh process (its own JVM); results go to
bench/results/stage_profile.json (``--output``). ``--again N``: N more runs after each, in
its JVM (a new Spark session each; seconds per stage only): what the JVM's warm-up costs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from fm_config import PROJECT_ROOT

LONG_SOURCE = "bench_long"
NUMBERS = 48  # the standard shape's 44 floats and 4 ints


def long_source_yaml() -> str:
    from bench.standard import ENTITY, FLOATS, INTS

    features = [f"    - {{name: f{j:02d}, type: float}}" for j in range(FLOATS)] + [f"    - {{name: n{j}, type: int}}" for j in range(INTS)]
    return (
        f"source:\n  name: {LONG_SOURCE}\n  entity: {ENTITY}\n  location: {LONG_SOURCE}\n  layout: long\n  date_column: ds\n"
        "  timestamp_column: event_ts\n  name_column: feature_name\n  value_column: value\n  schedule: bench\n  features:\n"
        + "\n".join(features) + "\n"
    )  # fmt: skip


def write_long_table(spark, path: Path, entities: int) -> None:
    """The standard entities' numbers, one row per (entity, feature), with an event time."""
    from pyspark.sql import functions as F

    from bench.standard import DATE, FLOATS, INTS, standard_frame

    names = [f"f{j:02d}" for j in range(FLOATS)] + [f"n{j}" for j in range(INTS)]
    wide = standard_frame(spark, entities, DATE, max(4, -(-entities // 250_000)))
    pairs = F.explode(F.array(*[F.struct(F.lit(n).alias("feature_name"), F.col(n).cast("double").alias("value")) for n in names]))
    long = wide.select("entity_id", "ds", pairs.alias("p")).select("entity_id", "p.feature_name", "p.value", "ds")
    long = long.withColumn("event_ts", F.to_timestamp(F.lit(f"{DATE} 06:00:00")))
    long.write.format("delta").mode("overwrite").save(str(path))


def _conf(env: str, workdir: Path, defs: Path, entities: int, redis_url: str, sinks: list[str], event_log: Path, extra: dict):
    from fm_config import load_config

    return load_config(
        env,
        {
            "data_root": str(workdir / "data" / str(entities)),
            "reports_dir": str(workdir / "reports"),
            "definitions_dir": str(defs),
            "sinks": sinks,
            "redis": {"url": redis_url, "password_env": None, "capacity_bytes": 64 << 30, "namespace": None},
            "spark": {
                "master": "local[2]",
                "extra": {
                    "spark.eventLog.enabled": "true",
                    "spark.eventLog.dir": event_log.as_uri(),
                    "spark.eventLog.compress": "false",
                    "spark.eventLog.rolling.enabled": "false",  # one plain JSON-lines file
                    **extra,
                },
            },  # fmt: skip
        },
    )


def _table(spark, conf, defs, name: str, entities: int) -> None:
    from bench.standard import SHAPE_VERSION, write_standard_table
    from jobs.pipeline.read import source_path

    table = Path(source_path(conf, defs.source(name)))
    marker, stamp = table / "_bench_rows", f"shape {SHAPE_VERSION}, {entities} entities"
    if marker.is_file() and marker.read_text() == stamp:
        return
    start = time.perf_counter()
    (write_long_table if name == LONG_SOURCE else write_standard_table)(spark, table, entities)
    marker.write_text(stamp)
    print(f"  made {name} ({entities:,} entities) in {time.perf_counter() - start:.0f} s", flush=True)


def run_one(env: str, workdir: Path, entities: int, layout: str, sinks: list[str], redis_url: str, extra: dict, again: int = 0) -> dict:
    """The child process: one run, its summary's stage seconds and its event log per stage;
    then ``again`` more runs in this JVM, each in a new Spark session (their seconds only)."""
    import psycopg
    from psycopg import sql as pgsql

    from bench.standard import DATE, ENTITIES_YAML, SOURCE, write_definitions
    from feature_defs import load_definitions
    from jobs.pipeline.run import run_source
    from jobs.spark import build_spark

    if layout == "long":  # a folder of its own: the same entity type, the same feature names
        folder = workdir / "defs-long"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "entities.yaml").write_text(ENTITIES_YAML)
        (folder / f"{LONG_SOURCE}.yaml").write_text(long_source_yaml())
    else:
        folder = write_definitions(workdir / "defs")
    event_log = Path(tempfile.mkdtemp(prefix="events-", dir=workdir))
    conf = _conf(env, workdir, folder, entities, redis_url, sinks, event_log, extra)
    defs = load_definitions(conf.path(conf.definitions_dir))
    name = LONG_SOURCE if layout == "long" else SOURCE
    spark = build_spark(conf.spark)
    try:
        _table(spark, conf, defs, name, entities)
        if "sql" in sinks:
            password = conf.sql_password()
            with psycopg.connect(conf.sql.dsn, password=password.get_secret_value() if password else None, autocommit=True) as conn:
                conn.execute(pgsql.SQL("DROP TABLE IF EXISTS {}").format(pgsql.Identifier(defs.entity_of(defs.source(name)).sql_table)))
        import redis

        redis.Redis.from_url(redis_url).flushall()
        summary = run_source(spark, conf, defs, name, DATE)
        if summary.status != "succeeded":
            raise RuntimeError(f"run failed: {summary.error}")
    finally:
        spark.stop()
    (log,) = event_log.iterdir()  # a fresh folder per run: this run's log alone
    per_stage = stage_costs(log)
    writers = {s: v.get("slowest_writer_seconds") for s, v in summary.sinks.items()}
    warm = []
    for _ in range(again):  # the JVM stays, its compiled code with it
        spark = build_spark(conf.spark)
        try:
            redis.Redis.from_url(redis_url).flushall()
            warm_summary = run_source(spark, conf, defs, name, DATE)
        finally:
            spark.stop()
        warm.append({"run_seconds": round(warm_summary.seconds, 2), "stages": {k: round(v, 2) for k, v in warm_summary.stages.items()}})
    return {
        "entities": entities, "layout": layout, "sinks": sinks, "spark": extra, "run_seconds": summary.seconds,
        "stages": {name: {"wall_seconds": round(seconds, 3), **per_stage.get(name, {})} for name, seconds in summary.stages.items()},
        "untagged": per_stage.get(None, {}), "writer_seconds": writers, "jobs": per_stage["_jobs"], "again_in_this_jvm": warm,
    }  # fmt: skip


def run_many(env: str, workdir: Path, entities: int, sources: int, redis_url: str, parallel: int | None, count: int) -> dict:
    """The first ``count`` of ``sources`` sources of ``entities`` entities each (each its own
    entity type, all over the same standard table) in this process's one Spark session, as
    one `materialize run` does them. The parent runs one alone and all of them, each in a
    process of its own: a JVM, once warmed, stays warm after its Spark session stops."""
    from bench.standard import DATE, ENTITIES_YAML, ENTITY, SOURCE, source_yaml, write_definitions
    from feature_defs import load_definitions
    from jobs.pipeline.run import for_each_source, run_source
    from jobs.spark import build_spark

    write_definitions(workdir / "defs")  # the table's folder name
    folder = workdir / f"defs-{sources}-sources"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"{SOURCE}_{i}" for i in range(sources)]
    entity_yaml = ENTITIES_YAML.split("\n", 1)[1]  # one entity's lines, without 'entities:'
    (folder / "entities.yaml").write_text("entities:\n" + "".join(
        entity_yaml.replace(ENTITY, f"{ENTITY}_{i}").replace("prefix: b", f"prefix: b{i}").replace("bench_features", f"bench_features_{i}")
        for i in range(sources)
    ))  # fmt: skip
    for i, name in enumerate(names):
        text = source_yaml().replace(f"name: {SOURCE}", f"name: {name}").replace(f"entity: {ENTITY}", f"entity: {ENTITY}_{i}")
        (folder / f"{name}.yaml").write_text(text)  # location stays the one table
    conf = _conf(env, workdir, folder, entities, redis_url, ["redis"], Path(tempfile.mkdtemp(dir=workdir)), {})
    if parallel:
        conf = conf.model_copy(update={"parallel_sources": parallel})
    defs = load_definitions(folder)
    spark = build_spark(conf.spark)
    try:
        _table(spark, conf, load_definitions(workdir / "defs"), SOURCE, entities)
        import redis

        redis.Redis.from_url(redis_url).flushall()  # each measurement writes into an empty server
        start = time.perf_counter()
        failed = []

        def done(name, summary, exc):
            if exc is not None or summary.status != "succeeded":
                failed.append(f"{name}: {exc or summary.error}")

        # as `materialize run` does them: parallel_sources at a time
        for_each_source(names[:count], lambda name: run_source(spark, conf, defs, name, DATE), conf.parallel_sources, done)
        if failed:
            raise RuntimeError(f"runs failed: {failed}")
        return {"seconds": round(time.perf_counter() - start, 2), "parallel_sources": conf.parallel_sources}
    finally:
        spark.stop()


def stage_costs(event_log: Path) -> dict:
    """Per fm.stage: Spark jobs, stages and tasks that ran, and their summed task metrics."""
    job_stage: dict[int, str | None] = {}
    stage_of: dict[int, str | None] = {}
    job_site: dict[int, str] = {}
    totals: dict = defaultdict(lambda: defaultdict(float))
    stages_run: dict = defaultdict(set)
    per_job: dict = defaultdict(lambda: defaultdict(float))
    task_job: dict[int, int] = {}
    job_start: dict[int, int] = {}
    with event_log.open() as f:
        for line in f:
            e = json.loads(line)
            kind = e.get("Event")
            if kind == "SparkListenerJobStart":
                props = e.get("Properties") or {}
                tag = props.get("fm.stage")
                job_stage[e["Job ID"]] = tag
                job_site[e["Job ID"]] = props.get("callSite.short", "")
                for sid in e["Stage IDs"]:
                    stage_of[sid] = tag
                    task_job[sid] = e["Job ID"]
                totals[tag]["jobs"] += 1
                job_start[e["Job ID"]] = e["Submission Time"]
            elif kind == "SparkListenerJobEnd":
                took = (e["Completion Time"] - job_start.pop(e["Job ID"], e["Completion Time"])) / 1000
                totals[job_stage.get(e["Job ID"])]["job_wall_s"] += took
                per_job[e["Job ID"]]["job_wall_s"] += took
            elif kind == "SparkListenerTaskEnd":
                sid = e["Stage ID"]
                tag = stage_of.get(sid)
                m = e.get("Task Metrics") or {}
                row = totals[tag]
                stages_run[tag].add(sid)
                values = {
                    "tasks": 1,
                    "executor_run_s": m.get("Executor Run Time", 0) / 1000,
                    "executor_cpu_s": m.get("Executor CPU Time", 0) / 1e9,
                    "gc_s": m.get("JVM GC Time", 0) / 1000,
                    "shuffle_write_mb": (m.get("Shuffle Write Metrics") or {}).get("Shuffle Bytes Written", 0) / 2**20,
                    "shuffle_read_mb": sum(
                        (m.get("Shuffle Read Metrics") or {}).get(k, 0) for k in ("Remote Bytes Read", "Local Bytes Read")
                    )
                    / 2**20,
                    "input_mb": (m.get("Input Metrics") or {}).get("Bytes Read", 0) / 2**20,
                }
                for k, v in values.items():
                    row[k] += v
                    per_job[task_job.get(sid)][k] += v
    out: dict = {}
    for tag, row in totals.items():
        out[tag] = {k: round(v, 3) for k, v in row.items()} | {"spark_stages": len(stages_run[tag])}
    # the jobs that matter (the others are listed in the stage totals)
    out["_jobs"] = [
        {"job": j, "stage": job_stage.get(j), "call_site": job_site.get(j, ""), **{k: round(v, 3) for k, v in per_job[j].items()}}
        for j in sorted(job_stage)
        if max(per_job[j].get("job_wall_s", 0), per_job[j].get("executor_run_s", 0)) >= 0.5
    ]
    return out


def _child_command(env: str, workdir: Path, *more: str) -> list[str]:
    """This module run again as a child process (its own JVM)."""
    return [sys.executable, "-m", "bench.stage_profile", "--env", env, "--workdir", str(workdir), *more]


def _print(result: dict) -> None:
    head = f"{result['entities']:,} entities, {result['layout']} layout, {'+'.join(result['sinks'])}: run {result['run_seconds']:.1f} s"
    print(f"\n{head}")
    cols = (
        "wall_seconds",
        "job_wall_s",
        "jobs",
        "spark_stages",
        "tasks",
        "executor_run_s",
        "executor_cpu_s",
        "gc_s",
        "shuffle_write_mb",
        "shuffle_read_mb",
        "input_mb",
    )
    print("| stage | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for name, row in result["stages"].items():
        print(
            f"| {name} | "
            + " | ".join(f"{row.get(c, 0):,.1f}" if isinstance(row.get(c, 0), float) else f"{row.get(c, 0):,}" for c in cols)
            + " |"
        )
    for i, run in enumerate(result.get("again_in_this_jvm", []), 2):
        print(f"run {i} in the same JVM: {run['run_seconds']:.1f} s; " + ", ".join(f"{k} {v:.1f}" for k, v in run["stages"].items()))
    if result["untagged"]:
        print("| (no stage) | - | " + " | ".join(f"{result['untagged'].get(c, 0):,.1f}" for c in cols[1:]) + " |")
    print(f"writers' own seconds (Python): {result['writer_seconds']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.stage_profile", description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="local")
    p.add_argument("--entities", default="100000", help="comma-separated sizes (default 100000)")
    p.add_argument("--layout", default="wide", help="wide, long or wide,long (default wide)")
    p.add_argument("--sinks", choices=["redis", "both"], default="redis")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench")
    p.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "stage_profile.json")
    p.add_argument("--sources", type=int, help="instead: N sources of --entities each in one session, against one alone")
    p.add_argument("--parallel", type=int, help="with --sources: sources at once (default: the env's parallel_sources)")
    p.add_argument("--spark", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting for the run (experiments)")
    p.add_argument(
        "--again", type=int, default=0, help="after each profiled run, N more in its JVM (a new Spark session each): their seconds"
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child and args.sources:
        entities, redis_url, count, out = json.loads(args.child)
        Path(out).write_text(json.dumps(run_many(args.env, args.workdir, entities, args.sources, redis_url, args.parallel, count)))
        return 0
    if args.child:
        entities, layout, sinks, redis_url, extra, out = json.loads(args.child)
        Path(out).write_text(json.dumps(run_one(args.env, args.workdir, entities, layout, sinks, redis_url, extra, args.again)))
        return 0

    from throwaway.servers import start_redis

    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    server = start_redis(workdir, "--hash-max-listpack-value", "256", "--logfile", str(workdir / "redis.log"))
    sinks = ["redis", "sql"] if args.sinks == "both" else ["redis"]
    results = []
    if args.sources:
        try:
            entities = int(args.entities.split(",")[0])
            many: dict = {"entities_per_source": entities, "sources": args.sources}
            for label, count in (("one source", 1), (f"{args.sources} sources", args.sources)):
                out = workdir / f"profile-{args.sources}-sources.json"
                child = json.dumps([entities, server.url, count, str(out)])
                cmd = _child_command(args.env, workdir, "--sources", str(args.sources), "--child", child)
                cmd += ["--parallel", str(args.parallel)] if args.parallel else []
                subprocess.run(cmd, check=True, cwd=PROJECT_ROOT)
                measured = json.loads(out.read_text())
                many[label], many["parallel_sources"] = measured["seconds"], measured["parallel_sources"]
            many["ratio"] = round(many[f"{args.sources} sources"] / many["one source"], 2)
        finally:
            server.stop()
        print(
            f"\n{many['sources']} sources of {many['entities_per_source']:,} entities in one run, "
            f"{many['parallel_sources']} at a time: {many[str(many['sources']) + ' sources']} s; "
            f"one alone: {many['one source']} s; ratio {many['ratio']}x (target <= 2x)"
        )
        previous = json.loads(args.output.read_text()) if args.output.is_file() else {}
        previous.setdefault("many_sources", {})[
            f"{many['sources']} x {many['entities_per_source']}, {many['parallel_sources']} at a time"
        ] = many
        args.output.write_text(json.dumps(previous, indent=1) + "\n")
        return 0
    try:
        for entities in (int(n) for n in args.entities.split(",")):
            for layout in args.layout.split(","):
                out = workdir / f"profile-{entities}-{layout}.json"
                extra = dict(kv.split("=", 1) for kv in args.spark)
                child = json.dumps([entities, layout, sinks, server.url, extra, str(out)])
                cmd = _child_command(args.env, workdir, "--again", str(args.again), "--child", child)
                subprocess.run(cmd, check=True, cwd=PROJECT_ROOT)
                results.append(json.loads(out.read_text()))
                _print(results[-1])
    finally:
        server.stop()
    previous = json.loads(args.output.read_text()) if args.output.is_file() else {}
    previous.setdefault("runs", {})
    for r in results:
        previous["runs"][
            " ".join([str(r["entities"]), r["layout"], "+".join(r["sinks"]), *(f"{k}={v}" for k, v in r["spark"].items())])
        ] = r
    args.output.write_text(json.dumps(previous, indent=1) + "\n")
    print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
