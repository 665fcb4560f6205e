"""Side by side with Feast on Feast's own example: `feast init` (Feast 0.67, in a venv of its
own) writes its driver-stats repository with its Parquet data. The repository is imported
with `materialize import-feast` and materialized by this project's job (Redis and
PostgreSQL); `feast materialize` writes the same repository into another Redis database.
Feast's own SDK then reads Feast's store, and `materialize serve` through Feast's remote
online store, for every driver and every imported feature: the values must be the same.
What the import leaves out of the example, each with its reason, is checked exactly in
tests/test_feast_import.py (INIT_LEFT_OUT).

Feast 0.67's remote client drops event timestamps (its `to_dict(include_event_timestamps=True)`
gives none), so the server's own response carries them, compared with those Feast's SDK
reads from Feast's store. Float32 features are compared as float32: Feast's store hands back
the float64 of the float32, the format stores the float32's shortest text.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from feature_defs import load_definitions
from fm_config import QualityConf, RunConf
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.cli import main
from throwaway import feast_venv

from .support.serving import serve

pytestmark = pytest.mark.install  # Feast runs from a venv of its own

DRIVERS = [1001, 1002, 1003, 1004, 1005, 9999]  # 9999: no such driver
VIEWS = ("driver_hourly_stats", "driver_hourly_stats_fresh")
FEATURES = ("conv_rate", "acc_rate", "avg_daily_trips", "driver_metadata", "driver_config", "driver_profile")
FLOAT32 = ("conv_rate", "acc_rate")
FEAST_DB, OUR_DB = 11, 12


def feast(repo: Path, *args: str) -> str:
    done = subprocess.run([str(feast_venv.feast()), *args], cwd=repo, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"feast {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
    return done.stdout


def feast_reads(client_dir: Path, features: list[str]) -> dict:
    """What Feast's SDK returns (`to_dict(include_event_timestamps=True)`, full feature names)
    through the feature_store.yaml in ``client_dir``."""
    request = json.dumps({"features": features, "entity_rows": [{"driver_id": d} for d in DRIVERS]})
    script = Path(__file__).with_name("feast_reads.py")
    done = subprocess.run([str(feast_venv.python()), str(script), request], cwd=client_dir, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def example(tmp_path_factory, spark, redis_server, pg_server):
    """Feast's example, imported and written by both; Feast's registry and our conf."""
    root = tmp_path_factory.mktemp("side-by-side")
    feast(root, "init", "demo")
    repo = root / "demo" / "feature_repo"

    defs_dir = root / "defs"
    assert main(["import-feast", str(repo), "--out", str(defs_dir), "--feast-python", str(feast_venv.python())]) == 0
    defs = load_definitions(defs_dir)
    assert sorted(s.name for s in defs.sources.values()) == sorted(VIEWS)

    # this project's job, in-process, for today's date (the example's rows end an hour ago)
    from jobs.pipeline.run import run_source

    redis_server.client(OUR_DB).flushdb()
    with pg_server.connect() as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
    base = redis_server.url.rsplit("/", 1)[0]
    conf = RunConf(
        env="test", data_root=str(root), reports_dir=str(root / "reports"), definitions_dir=str(defs_dir),
        sinks=["redis", "cockroach"], redis=RedisSettings(url=f"{base}/{OUR_DB}", password_env=None, mode="standalone"),
        sql=SqlSettings(dsn=pg_server.dsn, password_env=None),
        quality=QualityConf(expectations=False, verify_sample=10), reader=ReaderSettings(timeout_ms=10000),
    )  # fmt: skip
    today = dt.datetime.now(dt.UTC).date()
    for view in VIEWS:
        summary = run_source(spark, conf, defs, view, today)
        assert summary.status == "succeeded", summary.error

    # Feast: the same repository, its online store a Redis database of its own
    redis_server.client(FEAST_DB).flushdb()
    yaml_path = repo / "feature_store.yaml"
    settings = yaml_path.read_text()
    online = settings.index("online_store:")
    end = settings.index("\n", settings.index("path:", online))
    port = base.rsplit(":", 1)[1]
    store = f'online_store:\n    type: redis\n    connection_string: "127.0.0.1:{port},db={FEAST_DB}"'
    yaml_path.write_text(settings[:online] + store + settings[end:])
    feast(repo, "apply")
    feast(repo, "materialize", "2000-01-01T00:00:00", dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return repo, conf


@pytest.fixture(scope="module")
def served(example, tmp_path_factory):
    repo, conf = example
    settings = {
        "definitions_dir": conf.definitions_dir, "sinks": ["redis", "cockroach"],
        "redis": {"url": conf.redis.url, "password_env": None, "mode": "standalone"}, "sql": {"dsn": conf.sql.dsn, "password_env": None},
    }  # fmt: skip
    server = serve(tmp_path_factory.mktemp("serve"), "t", settings)
    yield server
    server.stop()


def remote_client(repo: Path, port: int, folder: Path) -> Path:
    """A Feast client of the example's registry whose online store is `materialize serve`."""
    folder.mkdir()
    (folder / "feature_store.yaml").write_text(
        f"project: demo\nregistry: {repo / 'data' / 'registry.db'}\nprovider: local\n"
        f"online_store:\n    type: remote\n    path: http://127.0.0.1:{port}\nentity_key_serialization_version: 3\n"
        "auth:\n    type: no_auth\n"
    )
    return folder


def as_compared(feature: str, values: list) -> list:
    if feature in FLOAT32:
        return [None if v is None else float(np.float32(v)) for v in values]
    return [json.loads(v) if isinstance(v, str) and feature == "driver_config" else v for v in values]


def test_feasts_sdk_reads_the_same_values_from_feast_and_from_materialize_serve(example, served, tmp_path):
    repo, _ = example
    refs = [f"{view}:{feature}" for view in VIEWS for feature in FEATURES]
    from_feast = feast_reads(repo, refs)
    from_ours = feast_reads(remote_client(repo, served.port, tmp_path / "client"), refs)

    assert from_ours["driver_id"] == from_feast["driver_id"] == DRIVERS
    for view in VIEWS:
        for feature in FEATURES:
            name = f"{view}__{feature}"
            feast_values, our_values = from_feast[name], from_ours[name]
            assert feast_values[-1] is None and our_values[-1] is None, name  # no such driver
            assert all(v is not None for v in feast_values[:-1]), (name, feast_values)  # Feast has every driver
            assert as_compared(feature, our_values) == as_compared(feature, feast_values), name


def test_event_timestamps_are_feasts(example, served):
    repo, _ = example
    refs = [f"{view}:{feature}" for view in VIEWS for feature in FEATURES]
    from_feast = feast_reads(repo, refs)
    status, body = served.post({"features": refs, "entities": {"driver_id": DRIVERS}, "full_feature_names": True})
    assert status == 200, body
    got = json.loads(body)
    names = got["metadata"]["feature_names"]
    for view in VIEWS:
        for feature in FEATURES:
            name = f"{view}__{feature}"
            result = got["results"][names.index(name)]
            ours = [int(dt.datetime.fromisoformat(t.replace("Z", "+00:00")).timestamp()) for t in result["event_timestamps"][:-1]]
            assert ours == from_feast[f"{name}__ts"][:-1], name
            assert result["statuses"][:-1] == ["PRESENT"] * 5, name
            assert result["statuses"][-1] == "NOT_FOUND", name  # Feast's Redis store says PRESENT with a value of None
