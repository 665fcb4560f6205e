"""Feast's own example, shared by the tests that meet Feast's SDK (test_feast_side_by_side,
test_push_feast): `feast init` (Feast 0.67, in its venv at .run/feast-venv) writes its
driver-stats repository with its Parquet data; `materialize import-feast` imports it; this
project's job writes it into Redis and PostgreSQL; `materialize serve` serves it to Feast's
remote online store. Each step is a function: the modules' fixtures call those they need.
"""

from __future__ import annotations

import datetime as dt
import json
import select
import subprocess
from pathlib import Path

import numpy as np

from feature_defs import Definitions, load_definitions
from fm_config import QualityConf, RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.cli import main
from throwaway import feast_venv
from throwaway.servers import PostgresServer, RedisServer

from .serving import Served, serve

VIEWS = ("driver_hourly_stats", "driver_hourly_stats_fresh")
FEATURES = ("conv_rate", "acc_rate", "avg_daily_trips", "driver_metadata", "driver_config", "driver_profile")
"""The features of both views (Feast's example gives them the same schema)."""
FLOAT32 = ("conv_rate", "acc_rate")
FEAST_DB, OUR_DB = 11, 12
"""Redis databases: Feast's own online store's (`feast materialize`), this project's."""


def feast(repo: Path, *args: str) -> str:
    """Feast's command line in ``repo``; its output."""
    done = subprocess.run([str(feast_venv.feast()), *args], cwd=repo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"feast {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def imported_example(root: Path) -> tuple[Path, Path, Definitions]:
    """`feast init demo` in ``root``, imported with `materialize import-feast` into root/defs:
    the Feast repository, the definitions folder and its definitions."""
    feast(root, "init", "demo")
    repo = root / "demo" / "feature_repo"
    defs_dir = root / "defs"
    assert main(["import-feast", str(repo), "--out", str(defs_dir), "--feast-python", str(feast_venv.python())]) == 0
    defs = load_definitions(defs_dir)
    assert sorted(s.name for s in defs.sources.values()) == sorted(VIEWS)
    return repo, defs_dir, defs


def our_conf(root: Path, defs_dir: Path, redis_server: RedisServer, pg_server: PostgresServer) -> RunConf:
    """The run's conf: Redis database OUR_DB and the suite's PostgreSQL."""
    base = redis_server.url.rsplit("/", 1)[0]
    return RunConf(
        env="test", data_root=str(root), reports_dir=str(root / "reports"), definitions_dir=str(defs_dir),
        sinks=["redis", "sql"], redis=RedisSettings(url=f"{base}/{OUR_DB}", password_env=None, mode="standalone"),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        quality=QualityConf(expectations=False, verify_sample=10), reader=ReaderSettings(timeout_ms=10000),
    )  # fmt: skip


def materialize_ours(spark, conf: RunConf, defs: Definitions, redis_server: RedisServer, pg_server: PostgresServer) -> None:
    """Empty stores (Redis database OUR_DB, PostgreSQL's public schema), then this project's
    job, in-process, writes every view for today's date (the example's rows end an hour ago)."""
    from jobs.pipeline.run import run_source

    redis_server.client(OUR_DB).flushdb()
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    today = dt.datetime.now(dt.UTC).date()
    for view in VIEWS:
        summary = run_source(spark, conf, defs, view, today)
        assert summary.status == "succeeded", summary.error


def materialize_feasts(repo: Path, redis_server: RedisServer) -> None:
    """Feast's own: the repository's online store made a Redis database of its own (FEAST_DB),
    then `feast apply` and `feast materialize` up to now."""
    redis_server.client(FEAST_DB).flushdb()
    yaml_path = repo / "feature_store.yaml"
    settings = yaml_path.read_text()
    online = settings.index("online_store:")
    end = settings.index("\n", settings.index("path:", online))
    port = redis_server.url.rsplit("/", 1)[0].rsplit(":", 1)[1]
    store = f'online_store:\n    type: redis\n    connection_string: "127.0.0.1:{port},db={FEAST_DB}"'
    yaml_path.write_text(settings[:online] + store + settings[end:])
    feast(repo, "apply")
    feast(repo, "materialize", "2000-01-01T00:00:00", dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S"))


def serve_ours(conf: RunConf, tmp: Path, **more) -> Served:
    """`materialize serve` on the run's stores (``more``: further top-level settings, e.g. server=...)."""
    settings = {
        "definitions_dir": conf.definitions_dir, "sinks": list(conf.sinks),
        "redis": {"url": conf.redis.url, "password_env": None, "mode": "standalone"}, "sql": {"dsn": conf.sql.dsn, "password_env": None},
        **more,
    }  # fmt: skip
    return serve(tmp, "t", settings)


def remote_client(repo: Path, port: int, folder: Path) -> Path:
    """A Feast client of the example's registry whose online store is `materialize serve`
    (its feature_store.yaml in ``folder``, made if missing)."""
    folder.mkdir(exist_ok=True)
    (folder / "feature_store.yaml").write_text(
        f"project: demo\nregistry: {repo / 'data' / 'registry.db'}\nprovider: local\n"
        f"online_store:\n    type: remote\n    path: http://127.0.0.1:{port}\nentity_key_serialization_version: 3\n"
        "auth:\n    type: no_auth\n"
    )
    return folder


def as_compared(feature: str, values: list) -> list:
    """Values as compared: float32 features as the float32 they are (Feast's store hands back
    the float64 of the float32, the format stores the float32's shortest text), Json text parsed."""
    if feature in FLOAT32:
        return [None if v is None else float(np.float32(v)) for v in values]
    return [json.loads(v) if isinstance(v, str) and feature == "driver_config" else v for v in values]


class FeastSdk:
    """Feast's SDK in a process of Feast's venv (tests/feast_pushes.py) in ``folder``, answering
    one request at a time. The FeatureStore is made at the first request: the process may start
    (Feast's import takes most of its start) before ``folder``'s feature_store.yaml is written."""

    SCRIPT = Path(__file__).resolve().parent.parent / "feast_pushes.py"

    def __init__(self, folder: Path, log: Path):
        self.log = log
        self.process = subprocess.Popen(
            [str(feast_venv.python()), str(self.SCRIPT)], cwd=folder, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("wb"),
            text=True,
        )  # fmt: skip

    def ask(self, request: dict, timeout: float = 300) -> dict:
        """The answer: {"ok": ...} or {"error": <type>, "message": ...} (what Feast's SDK raised)."""
        assert self.process.poll() is None, f"Feast's SDK process exited: {self.log.read_text()[-3000:]}"
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)  # one line per request: nothing is left buffered
        assert ready, f"no answer from Feast's SDK within {timeout} s: {self.log.read_text()[-3000:]}"
        line = self.process.stdout.readline()
        assert line, f"Feast's SDK process exited: {self.log.read_text()[-3000:]}"
        return json.loads(line)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()  # its loop ends at the end of its input
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process.stdout.close()
