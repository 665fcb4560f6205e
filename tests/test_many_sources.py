"""`materialize run` over several sources at once (parallel_sources): the stores end up
exactly as after the same sources run one after another, one failing source stops no
other, every source is in the ledger, and the exit code says a source failed."""

from __future__ import annotations

import re
import shutil

import pytest

from feature_defs import DEFAULT_DIR
from jobs.cli import EXIT_FAILED, main
from jobs.operations.ledger import Ledger

from .conftest import DAY2_STR, env_conf

GOOD = ["consumer_daily", "store_features_long"]
MISSING = "source:\n  name: missing\n  entity: consumer\n  location: no_such_table\n  layout: wide\n  features:\n    - {name: ghost_score, type: float}\n"


@pytest.fixture
def many(tmp_path, monkeypatch, sample_root, redis_server):
    """An env 'many': the sample sources and one whose table does not exist, into the session's Redis."""
    defs = tmp_path / "defs"
    shutil.copytree(DEFAULT_DIR, defs, ignore=shutil.ignore_patterns("*.py", "*.md", "__pycache__"))
    (defs / "missing.yaml").write_text(MISSING)
    conf = env_conf(tmp_path / "conf", "many",
        f"data_root: {sample_root}\nquarantine_root: {tmp_path / 'quarantine'}\nledger_root: {tmp_path / 'ledger'}\n"
        f"reports_dir: {tmp_path / 'reports'}\ndefinitions_dir: {defs}\nsinks: [redis]\n"
        f"redis: {{url: '{redis_server.url}', password_env: null}}\n"
        "quality: {verify_sample: 50, max_bad_fraction: 0.05}\n"  # the gate and its data docs on: sources gate at once
    )  # fmt: skip
    monkeypatch.setenv("FM_CONF_DIR", str(conf))
    return tmp_path


def stored(client) -> dict:
    return {key: client.hgetall(key) for key in client.scan_iter()}


def test_sources_at_once_store_what_one_after_another_stores(many, redis_db, capfd, spark):
    run = ["run", "--env", "many", "--date", DAY2_STR]
    assert main([*run, "--parallel", "1"]) == EXIT_FAILED
    one_by_one = stored(redis_db)
    assert {k.split(b":")[0] for k in one_by_one} == {b"c", b"s"}  # both good sources wrote
    capfd.readouterr()

    redis_db.flushall()
    assert main([*run, "--parallel", "3"]) == EXIT_FAILED
    assert stored(redis_db) == one_by_one
    out = capfd.readouterr()
    for name in GOOD:
        assert f"== {name} {DAY2_STR} (env many)" in out.out
        assert f"report: {many / 'reports' / name / DAY2_STR / 'summary.json'}" in out.out
        docs = many / "reports" / name / DAY2_STR / "data_docs" / "index.html"
        assert re.search(rf"data docs +{re.escape(str(docs))}\n", out.out) and docs.is_file()
    assert "error: missing: SourceNotFound" in out.err and "failed: missing" in out.err

    steps = Ledger(spark, many / "ledger").list(last=10)
    assert sorted((s["source"], s["status"]) for s in steps) == sorted(
        [(name, "succeeded") for name in GOOD] * 2 + [("missing", "failed")] * 2
    )
    # the good sources' steps, oldest first: one after the other, then at the same time
    a1, b1, a2, b2 = sorted((s for s in steps if s["source"] in GOOD), key=lambda s: s["started_at"])
    assert b1["started_at"] >= a1["ended_at"]
    assert b2["started_at"] < a2["ended_at"]
