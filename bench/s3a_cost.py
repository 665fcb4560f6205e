"""What S3 costs: the same commands on local paths and on an S3 API (moto's server on
loopback, through Spark's S3A connector), in one script, per command and in total; and a
Spark session's start with and without the S3A jars on its classpath.

    python -m bench.s3a_cost [--output bench/results/s3a_results.json]

Needs the S3 test server (`bash scripts/setup.sh --test`) and a Redis (started here).
Loopback S3 measures the connector's and Delta's own work per request, not a network:
on real S3 each request also waits for the network (tens of ms)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fm_config import PROJECT_ROOT
from throwaway.servers import start_redis, start_s3

DAYS = ("2026-11-19", "2026-11-20")


def _conf(folder: Path, redis_url: str, root: str, reports: str, s3_endpoint: str | None) -> Path:
    extra = ""
    storage = ""
    if s3_endpoint:
        storage = f"storage:\n  s3_endpoint: {s3_endpoint}\n  s3_region: us-east-1\n"
        extra = "".join(
            f"    {k}: \"{v}\"\n"
            for k, v in {
                "spark.hadoop.fs.s3a.endpoint": s3_endpoint, "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
                "spark.hadoop.fs.s3a.path.style.access": "true", "spark.hadoop.fs.s3a.connection.ssl.enabled": "false",
            }.items()
        )  # fmt: skip
    (folder / "base").mkdir(parents=True)
    (folder / "bench").mkdir()
    (folder / "bench" / "m.yaml").write_text(
        f"data_root: {root}\nreports_dir: {reports}\n{storage}sinks: [redis]\nredis:\n  url: {redis_url}\n"
        f"quality:\n  data_docs: false\nspark:\n  master: local[2]\n  shuffle_partitions: 2\n  extra:\n{extra or '    {}'}\n"
    )
    return folder


def _flow(conf_dir: Path) -> dict[str, float]:
    commands = [
        ["sample-data", "--env", "bench", "--days", "2", "--end", DAYS[1], "--consumers", "300", "--stores", "60"],
        ["run", "--env", "bench", "--date", DAYS[1], "--source", "consumer_daily"],
        ["backfill", "--env", "bench", "--source", "consumer_daily", "--start", DAYS[0], "--end", DAYS[1], "--mode", "replay"],
        ["report", "--env", "bench", "--source", "consumer_daily", "--date", DAYS[1]],
    ]
    env = {**os.environ, "FM_CONF_DIR": str(conf_dir), "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    began = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "tests.cli_sequence", json.dumps(commands)],
        capture_output=True,
        text=True,
        env=env,
        cwd=PROJECT_ROOT,
        timeout=900,
    )
    total = time.perf_counter() - began
    if out.stdout.count("[exit 0]") != len(commands):
        raise RuntimeError(f"a command failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    took = [float(line.split()[1]) for line in out.stderr.splitlines() if line.startswith("[took")]
    return {"process": total, **{c[0]: t for c, t in zip(commands, took)}}


def _session_start(s3a: bool) -> float:
    code = (
        "import time; t=time.perf_counter(); from fm_config import SparkConf; from jobs.spark import build_spark; "
        f"s=build_spark(SparkConf(master='local[2]'), {['s3a://x/y'] if s3a else []!r}); s.range(1).count(); print(time.perf_counter()-t)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.s3a_cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--output", type=Path)
    args = p.parse_args(argv)
    starts = {
        "without S3A jars": min(_session_start(False) for _ in range(2)),
        "with S3A jars": min(_session_start(True) for _ in range(2)),
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        redis = start_redis(work / "redis", "--hash-max-listpack-value", "256", "--maxmemory", "256mb")
        s3 = start_s3(work / "moto.log")
        s3.create_bucket("lake")
        try:
            local = _flow(_conf(work / "conf-local", redis.url, str(work / "etl"), str(work / "reports"), None))
            redis.client().flushall()
            remote = _flow(_conf(work / "conf-s3", redis.url, "s3a://lake/etl", "s3a://lake/reports", s3.endpoint))
        finally:
            s3.stop()
            redis.stop()
    print(f"{'Spark session start (local[2], a first job)':<46} {'seconds':>8}")
    for name, seconds in starts.items():
        print(f"  {name:<44} {seconds:>8.1f}")
    print(f"\n{'command (300 consumers, 2 dates)':<32} {'local':>8} {'S3 (moto)':>10} {'ratio':>7}")
    for key in local:
        print(f"  {key:<30} {local[key]:>8.1f} {remote[key]:>10.1f} {remote[key] / max(local[key], 1e-9):>7.2f}")
    if args.output:
        args.output.write_text(json.dumps({"session_start_s": starts, "local_s": local, "s3_s": remote}, indent=2) + "\n")
        print(f"\nwrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
