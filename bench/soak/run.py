"""The soak's driver: servers, data, `materialize serve`, the load process, the faults on
a timeline, the server's RSS each second; then the analysis (analysis.py)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.soak import faults
from bench.soak.data import ENV, IN_PROCESS_ENV, NEW_DATE, conf_settings, prepare, write_conf

REDIS_ARGS = ("--appendonly", "yes", "--appendfsync", "everysec", "--hash-max-listpack-value", "256")
"""Persistence on: a restarted server has its data back."""
HOT = 200
"""Hot keys: this many entities (cached after their first read)."""
ABSENT = 0.02
"""Share of the cold keys that are not in the table (their Redis miss is read from PostgreSQL)."""
BODIES = 200
"""Hot bodies, sent round-robin."""


@dataclass
class Plan:
    entities: int = 20_000
    rates: dict = field(default_factory=lambda: {(1, "hot"): 100, (1, "cold"): 100, (100, "hot"): 10, (100, "cold"): 10})
    """Requests/s per (entities per request, keys)."""
    cluster_rate: int = 50
    """Requests/s of 1 x 50 (cold keys) to the second server, on Redis Cluster."""
    warm_up: float = 20.0
    quiet: float = 25.0
    """Seconds between faults (and after the last)."""
    faults: tuple = ("redis_paused", "redis_restarted", "postgres_restarted", "cluster_failover", "nightly_run", "slow_clients")
    pause_seconds: float = 5.0
    down_seconds: float = 5.0
    slow_clients: int = 200
    slow_seconds: float = 15.0
    server: dict = field(default_factory=dict)
    """Extra settings of the server's env (reader:, server:), over the defaults."""


@dataclass
class Stack:
    redis: object
    redis_dir: Path
    redis_args: tuple
    pg: object
    cluster: object = None
    redis_keys: int = 0


def _ids(rng: random.Random, plan: Plan, shape: int, keys: str) -> dict:
    """A stream's entities: hot, a few bodies over HOT entities sent round-robin (cached after
    their first read); cold, ids drawn afresh for each request over the whole table (2%
    not in it), so most are not in the cache, stale entries included."""
    if keys == "hot":
        hot = rng.sample(range(plan.entities), HOT)
        return {"ids": [rng.sample(hot, shape) for _ in range(BODIES)]}
    return {"draw": {"shape": shape, "entities": plan.entities, "absent_share": ABSENT, "seed": rng.randrange(1 << 30)}}


def _start_server(conf_dir: Path, log: Path) -> tuple[subprocess.Popen, str]:
    from bench.serve_load import _wait_http
    from throwaway.servers import free_port

    port = free_port()
    exe = str(Path(sys.executable).parent / "materialize")
    process = subprocess.Popen(
        [exe, "serve", "--env", ENV, "--port", str(port)], env={**os.environ, "FM_CONF_DIR": str(conf_dir)},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    _wait_http(f"{url}/health", process, f"materialize serve ({log})")
    return process, url


def _stop_server(process: subprocess.Popen) -> float | None:
    """SIGTERM; seconds until it exited (None: killed after 60 s)."""
    start = time.time()
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(60)
        return round(time.time() - start, 2)
    except ProcessLookupError:
        return 0.0
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        return None


def _rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def soak(workdir: Path, plan: Plan, spark=None, log=print) -> dict:
    """Run the soak; the raw material of the report (analysis.analyse makes the report)."""
    from throwaway.cluster import start_cluster
    from throwaway.servers import start_postgres, start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    redis_dir = workdir / "redis"
    shutil.rmtree(redis_dir, ignore_errors=True)
    args = (*REDIS_ARGS, "--logfile", str(workdir / "redis.log"))
    redis = start_redis(redis_dir, *args)
    pg = start_postgres()
    stack = Stack(redis, redis_dir, args, pg)
    servers: dict[str, subprocess.Popen] = {}
    load = None
    try:
        with_cluster = "cluster_failover" in plan.faults
        if with_cluster:
            stack.cluster = start_cluster(workdir / "cluster", 3, 1)
        stores = "Redis, PostgreSQL" + (", Redis Cluster" if with_cluster else "")
        log(f"writing {plan.entities:,} entities of the standard shape with the job ({stores})")
        _write(spark, workdir, plan, stack)
        stack.redis_keys = stack.redis.client().dbsize()
        conf_dir = write_conf(workdir / "conf", conf_settings(workdir, stack.redis.url, pg.dsn, **plan.server))
        servers["standalone"], url = _start_server(conf_dir, workdir / "serve.log")
        rng = random.Random(38)
        streams = [
            {"name": f"{shape} x 50, {keys}", "shape": shape, "keys": keys, "server": "standalone", "url": url, "rate": rate,
             **_ids(rng, plan, shape, keys)}
            for (shape, keys), rate in plan.rates.items()
        ]  # fmt: skip
        if with_cluster:
            cluster_settings = conf_settings(workdir, stack.cluster.url, pg.dsn, **{**plan.server, "sinks": ["redis"]})
            cluster_settings["redis"]["mode"] = "cluster"
            cluster_conf = write_conf(workdir / "conf-cluster", cluster_settings)
            servers["cluster"], curl = _start_server(cluster_conf, workdir / "serve-cluster.log")
            streams.append({"name": "1 x 50, cold, cluster", "shape": 1, "keys": "cold", "server": "cluster", "url": curl,
                            "rate": plan.cluster_rate, **_ids(rng, plan, 1, "cold")})  # fmt: skip
        from bench.standard import SOURCE

        stop = workdir / "load.stop"
        stop.unlink(missing_ok=True)
        out = workdir / "load.json"
        wire = [{k: s[k] for k in ("url", "rate", "ids", "draw") if k in s} for s in streams]
        spec = {"streams": wire, "table": str(workdir / "data" / SOURCE),
                "start": time.time() + 5, "stop": str(stop), "out": str(out)}  # fmt: skip
        (workdir / "load-spec.json").write_text(json.dumps(spec))
        load = subprocess.Popen([sys.executable, "-m", "bench.soak.load", str(workdir / "load-spec.json")])
        rss: dict[str, list] = {name: [] for name in servers}
        sampling = threading.Event()

        def sample() -> None:
            while not sampling.wait(1.0):
                for name, p in servers.items():
                    rss[name].append((round(time.time(), 2), _rss_mib(p.pid)))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        time.sleep(max(0.0, spec["start"] - time.time()) + plan.warm_up)
        warmed = time.time()
        load_before = os.getloadavg()
        windows: list[faults.Window] = []
        for name in plan.faults:
            if load.poll() is not None:
                raise RuntimeError(f"the load process exited ({load.returncode})")
            log(f"  {time.strftime('%H:%M:%S')} fault: {name}")
            windows.append(_inject(name, plan, stack, workdir, conf_dir, servers, url))
            log(f"  {time.strftime('%H:%M:%S')} back after {windows[-1].back - windows[-1].start:.1f} s; quiet {plan.quiet:.0f} s")
            time.sleep(plan.quiet)
        end = time.time()
        stop.touch()
        load.wait(120)
        load = None
        sampling.set()
        sampler.join()
        answers = json.loads(out.read_text())
        shutdown = {name: _stop_server(p) for name, p in servers.items()}
        servers.clear()
        return {
            "plan": {k: (v if not isinstance(v, dict) else {str(a): b for a, b in v.items()}) for k, v in plan.__dict__.items()},
            "streams": [{k: s[k] for k in ("name", "shape", "keys", "server", "rate")} for s in streams],
            "start": spec["start"], "warmed": warmed, "end": end,
            "windows": [w.__dict__ for w in windows], "rss_mib": rss, "shutdown_seconds": shutdown,
            "machine": {"cpus": os.cpu_count(), "load_average_at_warm_up": load_before, "load_average_at_end": os.getloadavg()},
            **answers,
        }  # fmt: skip
    finally:
        if load is not None:
            load.kill()
        for p in servers.values():
            _stop_server(p)
        stack.redis.stop()
        pg.stop()
        if stack.cluster is not None:
            stack.cluster.stop()


def _write(spark, workdir: Path, plan: Plan, stack: Stack) -> None:
    own = spark is None
    if own:
        from fm_config import load_config
        from jobs.spark import build_spark

        spark = build_spark(load_config(IN_PROCESS_ENV, conf_settings(workdir, stack.redis.url, stack.pg.dsn)).spark)
    try:
        prepare(spark, workdir, plan.entities, stack.redis.url, stack.pg.dsn)
        if stack.cluster is not None:
            from bench.soak.data import OLD_DATE
            from bench.standard import SOURCE
            from feature_defs import load_definitions
            from fm_config import load_config
            from jobs.pipeline.run import run_source

            settings = conf_settings(workdir, stack.cluster.url, stack.pg.dsn, sinks=["redis"])
            settings["redis"]["mode"] = "cluster"
            conf = load_config(IN_PROCESS_ENV, settings)
            summary = run_source(spark, conf, load_definitions(workdir / "defs"), SOURCE, OLD_DATE)
            if summary.status != "succeeded":
                raise RuntimeError(f"the job failed on the cluster: {summary.error}")
    finally:
        if own:
            spark.stop()


def _inject(name: str, plan: Plan, stack: Stack, workdir: Path, conf_dir: Path, servers: dict, url: str) -> faults.Window:
    if name == "redis_paused":
        return faults.redis_paused(stack.redis, plan.pause_seconds)
    if name == "redis_restarted":
        return faults.redis_restarted(stack, plan.down_seconds)
    if name == "postgres_restarted":
        return faults.postgres_restarted(stack.pg, plan.down_seconds)
    if name == "cluster_failover":
        return faults.cluster_failover(stack.cluster)
    if name == "nightly_run":
        return faults.nightly_run(conf_dir, NEW_DATE, workdir / "nightly.log")
    if name == "slow_clients":
        return faults.slow_clients(int(url.rsplit(":", 1)[1]), plan.slow_clients, plan.slow_seconds)
    raise ValueError(f"unknown fault {name!r}")
