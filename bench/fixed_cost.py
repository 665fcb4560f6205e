"""The fixed cost of a run, profiled: where each second of a small run's process goes.

    python -m bench.fixed_cost [--entities 2000] [--output bench/results/fixed_cost.json]

Two cases, each command a process of its own run through bench/fixed_cost_probe.py (its
steps timed from the interpreter's start):

- **Feast's example at ``--entities`` drivers x 3 rows** (bench/feast_example.py's data and
  import): `feast materialize` over every row, then `materialize run --date <last day> --sink
  redis`, both timed as whole processes, as a user times them.
- **The nightly DAG of one small source** (the sample `consumer_daily`, the local default's
  data written by `materialize sample-data`, into a throwaway Redis and PostgreSQL): the
  commands its tasks run (DAG_TASKS), each a process.

For each process: its wall time, the interpreter's start and the command line's import, the
time of each step (JVM and session, config, ledger reads and appends, leases, the stores'
comparison with the ledger, great-expectations' context, each source's run), what lies
outside them, and each source's stages from its summary. `redis-benchmark -t hset -P 64` is
run first, beside the absolute times. Development tooling: the product never imports it.
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

from bench.confs import bench_conf
from bench.feast_example import FEAST_DB, OUR_DB, feast, init_repo, our_conf, point_at, scale
from fm_config import PROJECT_ROOT

HERE = Path(__file__).parent
BIN = PROJECT_ROOT / ".venv" / "bin"
DAG_SOURCE = "consumer_daily"
DAG_DATE = "2026-11-20"  # the sample data's last day (jobs/sample_data.py)
DAG_TASKS = ("ready", "run", "report")
"""The commands the nightly DAG's tasks run for one source (airflow/dags/fm_nightly.py): one
poke of the sensor, the materialize task (spark-submit of the same run), the report. Until
this DAG's run gated and verified what it read, `validate` and `verify` were tasks too."""


def hset_anchor(workdir: Path) -> float:
    """`redis-benchmark -t hset -P 64` requests/s on a throwaway server: the machine's speed today."""
    from throwaway.servers import start_redis

    server = start_redis(workdir / "anchor")
    try:
        done = subprocess.run(
            ["redis-benchmark", "-p", str(server.port), "-t", "hset", "-P", "64", "-n", "2000000", "--csv"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    finally:
        server.stop()
    row = [line for line in done.stdout.splitlines() if line.startswith('"HSET')][0]
    return float(row.split(",")[1].strip('"'))


def probed(name: str, args: list[str], env: dict, workdir: Path) -> dict:
    """``materialize *args`` as a process through the probe: its wall time and its steps."""
    out = workdir / f"probe-{name}.json"
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "bench.fixed_cost_probe", str(out), *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if not out.exists():
        raise RuntimeError(f"materialize {' '.join(args)} failed ({done.returncode}): {done.stdout[-2000:]}{done.stderr[-3000:]}")
    probe = json.loads(out.read_text())
    return {"command": "materialize " + " ".join(args), "exit_code": done.returncode, "wall_s": round(wall, 2), **breakdown(probe)}


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def breakdown(probe: dict) -> dict:
    """Seconds per step (the union of its calls' spans, threads together), and what no step covers."""
    steps: dict[str, list] = {}
    for call in probe["calls"]:
        steps.setdefault(call["step"], []).append((call["start"], call["end"]))
    command_start = probe["interpreter_start_s"] + probe["cli_import_s"]
    covered = _union([span for spans in steps.values() for span in spans])
    return {
        "interpreter_start_s": probe["interpreter_start_s"],
        "cli_import_s": probe["cli_import_s"],
        "steps_s": {step: round(_union(spans), 2) for step, spans in sorted(steps.items(), key=lambda kv: min(kv[1]))},
        "calls": {step: len(spans) for step, spans in steps.items()},
        "outside_steps_s": round(probe["command_s"] - covered, 2),
        "command_s": probe["command_s"],
        "spark_stop_s": probe["spark_stop_s"],
        "command_started_at_s": round(command_start, 2),
    }


def stages(reports: Path) -> dict:
    """Each source's stage seconds from its last summary."""
    found = {}
    for summary in sorted(reports.glob("*/*/summary.json")):
        data = json.loads(summary.read_text())
        found[summary.parent.parent.name] = {"seconds": data.get("seconds"), "stages": data.get("stages")}
    return found


def feast_case(entities: int, workdir: Path) -> dict:
    import redis

    from throwaway import feast_venv
    from throwaway.servers import start_redis

    feast_venv.ensure()
    repo = init_repo(workdir)
    data = scale(repo / "data" / "driver_stats.parquet", entities, 3)
    defs = workdir / "defs"
    subprocess.run(
        [str(BIN / "materialize"), "import-feast", str(repo), "--out", str(defs), "--feast-python", str(feast_venv.python())],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    server = start_redis(workdir / "redis", "--hash-max-listpack-value", "256", "--maxmemory", "2gb")
    try:
        point_at(repo, server.port)
        redis.Redis(port=server.port, db=FEAST_DB).flushall()
        feast(repo, "apply")
        end = (dt.datetime.now(dt.UTC) + dt.timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
        feast_s = feast(repo, "materialize", "2000-01-01T00:00:00", end, timed=True)
        conf = our_conf(workdir, defs, f"redis://127.0.0.1:{server.port}/{OUR_DB}")
        env = dict(os.environ, FM_CONF_DIR=str(conf), FM_ENV="feast_example")
        day = data["last_event_time"][:10]
        ours = probed("feast-example-run", ["run", "--date", day, "--sink", "redis"], env, workdir)
    finally:
        server.stop()
    ours["stages"] = stages(workdir / "reports")
    return {"drivers": entities, "rows": data["rows"], "feast_materialize_s": round(feast_s, 2), "ours": ours,
            "feast_over_ours": round(feast_s / ours["wall_s"], 3)}  # fmt: skip


def dag_case(workdir: Path) -> dict:
    from throwaway.servers import start_postgres, start_redis

    redis_server, pg = start_redis(workdir / "redis", "--maxmemory", "512mb"), start_postgres()
    try:
        settings = (
            f"redis:\n  url: redis://127.0.0.1:{redis_server.port}/0\n  password_env: null\n"
            f"sql:\n  dsn: {pg.dsn}\n  password_env: null\n"
            f"data_root: {workdir / 'data'}\nreports_dir: {workdir / 'reports'}\nledger_root: {workdir / 'ledger'}\n"
            f"quarantine_root: {workdir / 'quarantine'}\n"
        )
        conf = bench_conf(workdir, "fixed_cost", settings)
        env = dict(os.environ, FM_CONF_DIR=str(conf), FM_ENV="fixed_cost")
        subprocess.run([str(BIN / "materialize"), "sample-data"], env=env, check=True, capture_output=True, text=True)
        one = ["--source", DAG_SOURCE, "--date", DAG_DATE]
        tasks = [probed(f"dag-{cmd}", [cmd, *one], env, workdir) for cmd in DAG_TASKS]
    finally:
        redis_server.stop()
        pg.stop()
    run = next(t for t in tasks if t["command"].startswith("materialize run"))
    run["stages"] = stages(workdir / "reports")
    total = sum(t["wall_s"] for t in tasks)
    return {
        "source": DAG_SOURCE, "date": DAG_DATE, "tasks": tasks, "tasks_s": round(total, 2),
        "tasks_over_run": round(total / run["wall_s"], 2),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.fixed_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--entities", type=int, default=2000, help="drivers of Feast's example (default 2,000)")
    p.add_argument("--workdir", type=Path, default=PROJECT_ROOT / ".run" / "bench" / "fixed-cost")
    p.add_argument("--output", type=Path, default=HERE / "results" / "fixed_cost.json")
    p.add_argument("--label", default="before", help="the key of this run in the output (default: before)")
    args = p.parse_args(argv)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    anchor = hset_anchor(args.workdir)
    print(f"redis-benchmark -t hset -P 64: {anchor:,.0f} requests/s", flush=True)
    example = feast_case(args.entities, args.workdir / "feast-example")
    print(json.dumps({k: v for k, v in example.items() if k != "ours"}), flush=True)
    dag = dag_case(args.workdir / "dag")
    print(json.dumps({k: v for k, v in dag.items() if k != "tasks"}), flush=True)
    results = json.loads(args.output.read_text()) if args.output.exists() else {}
    results[args.label] = {"when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "hset_anchor_rps": anchor,
                           "feast_example": example, "dag": dag}  # fmt: skip
    args.output.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
