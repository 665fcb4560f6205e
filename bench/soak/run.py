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
from bench.soak.faults import Hostile

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
    warm_up: float | None = None
    """Seconds of load before the first fault; None: until the cache holds its working set
    (analysis.working_set on the cache's bytes from /metrics, and at least an entry's lifetime)."""
    warm_up_cap: float = 240.0
    quiet: float = 25.0
    """Seconds between faults (and after the last)."""
    faults: tuple = (
        "redis_paused", "redis_restarted", "postgres_restarted", "cluster_failover", "nightly_run", "slow_clients", "pushes", "hostile",
    )  # fmt: skip
    pause_seconds: float = 5.0
    down_seconds: float = 5.0
    slow_clients: int = 200
    slow_seconds: float = 15.0
    push_seconds: float = 15.0
    """The push phase: twice server.push.max_in_flight clients pushing this long."""
    hostile: Hostile = field(default_factory=Hostile)
    jwks_refresh_seconds: float = 5.0
    """server.auth.jwks_refresh_seconds: short, so the JWKS is fetched (and trickles) several times in the hostile phase."""
    server: dict = field(default_factory=dict)
    """Extra settings of the server's env (reader:, server:), over the defaults."""
    gc_probe: bool = False
    """A diagnosis: the standalone server runs under gc_probe.py, probed before and after the hostile phase."""


@dataclass
class Stack:
    redis: object
    redis_dir: Path
    redis_args: tuple
    pg: object
    cluster: object = None
    redis_keys: int = 0
    signer: object = None
    idp: object = None


def _ids(rng: random.Random, plan: Plan, shape: int, keys: str) -> dict:
    """A stream's entities: hot, a few bodies over HOT entities sent round-robin (cached after
    their first read); cold, ids drawn afresh for each request over the whole table (2%
    not in it), so most are not in the cache, stale entries included."""
    if keys == "hot":
        hot = rng.sample(range(plan.entities), HOT)
        return {"ids": [rng.sample(hot, shape) for _ in range(BODIES)]}
    return {"draw": {"shape": shape, "entities": plan.entities, "absent_share": ABSENT, "seed": rng.randrange(1 << 30)}}


def _start_server(conf_dir: Path, log: Path, token: str, probe: Path | None = None) -> tuple[subprocess.Popen, str]:
    from bench.harness.servers import wait_http
    from throwaway.servers import free_port

    port = free_port()
    exe = [str(Path(sys.executable).parent / "materialize")] if probe is None else [sys.executable, "-m", "bench.soak.gc_probe", str(probe)]
    process = subprocess.Popen(
        [*exe, "serve", "--env", ENV, "--port", str(port)], env={**os.environ, "FM_CONF_DIR": str(conf_dir)},
        stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", process, f"materialize serve ({log})")
    _wait_keys(url, token, log)
    return process, url


def _wait_keys(url: str, token: str, log: Path, timeout: float = 30) -> None:
    """Until a read with ``token`` is answered other than 503 (the JWKS is fetched once the server runs)."""
    import urllib.error
    import urllib.request

    from bench.soak.data import features

    body = json.dumps({"features": features()[:1], "entities": {"entity_id": [0]}}).encode()
    end = time.monotonic() + timeout
    while True:
        request = urllib.request.Request(f"{url}/get-online-features", body, method="POST",
                                         headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=5):
                return
        except urllib.error.HTTPError as exc:
            if exc.code != 503:
                raise RuntimeError(f"a read with the soak's token got {exc.code}: {exc.read()[:300]!r} ({log})") from None
        if time.monotonic() > end:
            raise RuntimeError(f"the server at {url} had no JWKS keys after {timeout:.0f} s ({log})")
        time.sleep(0.2)


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


GAUGES = ("feature_reader_cache_entries", "feature_reader_cache_bytes", "feature_server_unsent_bytes")


def _gauges(url: str) -> tuple[float | None, ...]:
    """The server's GAUGES (its L1 cache's entries and bytes, its unsent answer bytes), from its /metrics (open without a token)."""
    import urllib.request

    found = {}
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=2) as answer:
            for line in answer.read().decode().splitlines():
                name, _, value = line.partition(" ")
                if name in GAUGES:
                    found[name] = float(value)
    except OSError:
        pass
    return tuple(found.get(name) for name in GAUGES)


class Sampler:
    """Each second, per server: its RSS (MiB), its cache's entries and bytes, its unsent answer bytes."""

    def __init__(self, servers: dict[str, subprocess.Popen], urls: dict[str, str]):
        self.servers, self.urls = servers, urls
        self.rss: dict[str, list] = {name: [] for name in servers}
        self.cache: dict[str, list] = {name: [] for name in servers}
        self.unsent: dict[str, list] = {name: [] for name in servers}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(1.0):
            for name, p in list(self.servers.items()):
                self.rss[name].append((round(time.time(), 2), _rss_mib(p.pid)))
                entries, size, unsent = _gauges(self.urls[name])
                self.cache[name].append((round(time.time(), 2), entries, size))
                self.unsent[name].append((round(time.time(), 2), unsent))

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()


def _settings(plan: Plan, path: tuple[str, ...], cls):
    """The servers' settings at ``path`` (reader.cache, server): conf/base's, under the plan's."""
    from feature_defs.yamlio import load_yaml
    from fm_config import PROJECT_ROOT

    layers = [load_yaml(PROJECT_ROOT / "conf" / "base" / "materialize.yaml")[0], plan.server]
    merged: dict = {}
    for node in layers:
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        merged.update(node or {})
    return cls(**merged)


def entry_lifetime(plan: Plan) -> float:
    """Seconds an L1 cache entry lives at most: ttl x (1 + jitter) + stale_if_error."""
    from fm_config.reader import CacheSettings

    c = _settings(plan, ("reader", "cache"), CacheSettings)
    return c.ttl_seconds * (1 + c.jitter) + c.stale_if_error_seconds


def _warm_up(plan: Plan, start: float, sampler: Sampler, load: subprocess.Popen, log) -> None:
    """Sleep through the warm-up: plan.warm_up seconds, or until the cache's bytes level off
    (analysis.working_set), at least an entry's lifetime (entries put first leave then) and
    at most plan.warm_up_cap."""
    from bench.soak.analysis import working_set

    time.sleep(max(0.0, start - time.time()))
    if plan.warm_up is not None:
        time.sleep(plan.warm_up)
        return
    lifetime = entry_lifetime(plan)
    while True:
        time.sleep(1.0)
        if load.poll() is not None:
            raise RuntimeError(f"the load process exited ({load.returncode})")
        now = time.time()
        if now - start >= plan.warm_up_cap:
            log(f"  the cache did not level off within {plan.warm_up_cap:.0f} s: warm-up ends there")
            return
        if now - start >= lifetime and working_set(sampler.cache["standalone"], start, now)["levelled"]:
            return


def _serve(workdir: Path, plan: Plan, stack: Stack, servers: dict, token: str) -> tuple[list[dict], Path, dict]:
    """The servers (with bearer tokens from the soak's JWKS) and the load's streams to them: (streams, conf dir, urls)."""
    from bench.soak.idp import auth_settings

    auth = auth_settings(stack.idp.url, plan.jwks_refresh_seconds)
    server = {**plan.server.get("server", {}), "auth": auth}
    if "pushes" in plan.faults:  # Feast's push API on, with its own limit within max_in_flight
        server["push"] = {"enabled": True, **server.get("push", {})}
    extra = {**plan.server, "server": server}
    conf_dir = write_conf(workdir / "conf", conf_settings(workdir, stack.redis.url, stack.pg.dsn, **extra))
    urls = {}
    probe = workdir / "gc-probe" if plan.gc_probe else None
    if probe is not None:
        shutil.rmtree(probe, ignore_errors=True)
        probe.mkdir()
    servers["standalone"], urls["standalone"] = _start_server(conf_dir, workdir / "serve.log", token, probe)
    rng = random.Random(38)
    streams = [
        {"name": f"{shape} x 50, {keys}", "shape": shape, "keys": keys, "server": "standalone", "url": urls["standalone"],
         "rate": rate, **_ids(rng, plan, shape, keys)}
        for (shape, keys), rate in plan.rates.items()
    ]  # fmt: skip
    if stack.cluster is not None:
        cluster_settings = conf_settings(workdir, stack.cluster.url, stack.pg.dsn, **{**extra, "sinks": ["redis"]})
        cluster_settings["redis"]["mode"] = "cluster"
        cluster_conf = write_conf(workdir / "conf-cluster", cluster_settings)
        servers["cluster"], urls["cluster"] = _start_server(cluster_conf, workdir / "serve-cluster.log", token)
        streams.append({"name": "1 x 50, cold, cluster", "shape": 1, "keys": "cold", "server": "cluster", "url": urls["cluster"],
                        "rate": plan.cluster_rate, **_ids(rng, plan, 1, "cold")})  # fmt: skip
    return streams, conf_dir, urls


def _start_load(workdir: Path, streams: list[dict], token: str) -> tuple[subprocess.Popen, dict]:
    from bench.standard import SOURCE

    stop = workdir / "load.stop"
    stop.unlink(missing_ok=True)
    wire = [{k: s[k] for k in ("url", "rate", "ids", "draw") if k in s} for s in streams]
    spec = {"streams": wire, "table": str(workdir / "data" / SOURCE), "token": token,
            "start": time.time() + 5, "stop": str(stop), "out": str(workdir / "load.json")}  # fmt: skip
    (workdir / "load-spec.json").write_text(json.dumps(spec))
    return subprocess.Popen([sys.executable, "-m", "bench.soak.load", str(workdir / "load-spec.json")]), spec


def soak(workdir: Path, plan: Plan, spark=None, log=print) -> dict:
    """Run the soak; the raw material of the report (analysis.analyse makes the report)."""
    from bench.soak.idp import READER, Idp, Signer
    from throwaway.cluster import start_cluster
    from throwaway.servers import start_postgres, start_redis

    workdir.mkdir(parents=True, exist_ok=True)
    redis_dir = workdir / "redis"
    shutil.rmtree(redis_dir, ignore_errors=True)
    args = (*REDIS_ARGS, "--logfile", str(workdir / "redis.log"))
    stack = Stack(start_redis(redis_dir, *args), redis_dir, args, start_postgres(), signer=Signer())
    stack.idp = Idp(stack.signer.jwks())
    servers: dict[str, subprocess.Popen] = {}
    load = None
    try:
        if "cluster_failover" in plan.faults:
            stack.cluster = start_cluster(workdir / "cluster", 3, 1)
        stores = "Redis, PostgreSQL" + (", Redis Cluster" if stack.cluster else "")
        log(f"writing {plan.entities:,} entities of the standard shape with the job ({stores})")
        _write(spark, workdir, plan, stack)
        stack.redis_keys = stack.redis.client().dbsize()
        token = stack.signer.token([READER])
        streams, conf_dir, urls = _serve(workdir, plan, stack, servers, token)
        load, spec = _start_load(workdir, streams, token)
        raw = _timeline(workdir, plan, stack, servers, urls, conf_dir, load, spec, log)
        load = None
        raw["streams"] = [{k: s[k] for k in ("name", "shape", "keys", "server", "rate")} for s in streams]
        raw["shutdown_seconds"] = {name: _stop_server(p) for name, p in servers.items()}
        servers.clear()
        return raw
    finally:
        if load is not None:
            load.kill()
        for p in servers.values():
            _stop_server(p)
        stack.redis.stop()
        stack.pg.stop()
        stack.idp.close()
        if stack.cluster is not None:
            stack.cluster.stop()


def _timeline(workdir: Path, plan: Plan, stack: Stack, servers: dict, urls: dict, conf_dir: Path, load, spec: dict, log) -> dict:
    """The warm-up, the faults one at a time with quiet periods, then the load's answers; the sampler meanwhile."""
    sampler = Sampler(servers, urls)
    try:
        _warm_up(plan, spec["start"], sampler, load, log)
        warmed = time.time()
        log(f"  {time.strftime('%H:%M:%S')} warm-up over after {warmed - spec['start']:.0f} s")
        load_before = os.getloadavg()
        windows: list[faults.Window] = []
        for name in plan.faults:
            if load.poll() is not None:
                raise RuntimeError(f"the load process exited ({load.returncode})")
            log(f"  {time.strftime('%H:%M:%S')} fault: {name}")
            before = _gc_probe(plan, workdir, name)
            windows.append(_inject(name, plan, stack, workdir, conf_dir, servers, urls["standalone"]))
            log(f"  {time.strftime('%H:%M:%S')} back after {windows[-1].back - windows[-1].start:.1f} s; quiet {plan.quiet:.0f} s")
            if before is not None:
                time.sleep(3.0)  # past the server's own malloc_trim, 1 s after a connection is dropped
                windows[-1].notes["gc_probe"] = {"before": before, "after": _gc_probe(plan, workdir, name)}
            time.sleep(plan.quiet)
        end = time.time()
        Path(spec["stop"]).touch()
        load.wait(120)
    finally:
        sampler.stop()
    answers = json.loads(Path(spec["out"]).read_text())
    return {
        "plan": _plain(plan), "start": spec["start"], "warmed": warmed, "end": end,
        "entry_lifetime_seconds": round(entry_lifetime(plan), 2), "windows": [w.__dict__ for w in windows],
        "rss_mib": sampler.rss, "cache": sampler.cache, "unsent_bytes": sampler.unsent, "jwks_fetches": stack.idp.fetches,
        "machine": {"cpus": os.cpu_count(), "load_average_at_warm_up": load_before, "load_average_at_end": os.getloadavg()},
        **answers,
    }  # fmt: skip


def _gc_probe(plan: Plan, workdir: Path, fault: str) -> dict | None:
    """With plan.gc_probe, around the hostile phase: what a full collection finds in the standalone server, and the RSS it frees."""
    from bench.soak.gc_probe import request

    return request(workdir / "gc-probe") if plan.gc_probe and fault == "hostile" else None


def _plain(plan: Plan) -> dict:
    out = {}
    for k, v in plan.__dict__.items():
        if isinstance(v, dict):
            v = {str(a): b for a, b in v.items()}
        elif hasattr(v, "__dataclass_fields__"):
            v = dict(v.__dict__)
        out[k] = v
    return out


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
    if name == "pushes":
        from bench.soak.idp import PUSHER
        from fm_config.reader import PushSettings

        limit = _settings(plan, ("server", "push"), PushSettings).max_in_flight
        return faults.pushes(url, stack.signer.token([PUSHER]), 2 * limit, plan.push_seconds, plan.entities)
    if name == "hostile":
        from fm_config.reader import ServerSettings

        write_deadline = _settings(plan, ("server",), ServerSettings).write_timeout_ms / 1000
        return faults.hostile(url, stack.idp, stack.signer, plan.entities, plan.hostile, write_deadline)
    raise ValueError(f"unknown fault {name!r}")
