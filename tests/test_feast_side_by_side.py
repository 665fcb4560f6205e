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

import pytest

from throwaway import feast_venv

from .support.feast_example import (
    FEATURES,
    VIEWS,
    as_compared,
    imported_example,
    materialize_feasts,
    materialize_ours,
    our_conf,
    remote_client,
    serve_ours,
)

pytestmark = pytest.mark.install  # Feast runs from a venv of its own

DRIVERS = [1001, 1002, 1003, 1004, 1005, 9999]  # 9999: no such driver


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
    repo, defs_dir, defs = imported_example(root)
    conf = our_conf(root, defs_dir, redis_server, pg_server)
    materialize_ours(spark, conf, defs, redis_server, pg_server)
    materialize_feasts(repo, redis_server)
    return repo, conf


@pytest.fixture(scope="module")
def served(example, tmp_path_factory):
    _, conf = example
    server = serve_ours(conf, tmp_path_factory.mktemp("serve"))
    yield server
    server.stop()


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
