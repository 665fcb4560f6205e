"""The command line as a user runs it: the console script and spark-submit."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

from serializers import decode, field_id

from .conftest import DAY2_STR

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(*args: str, env: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=ROOT)


def test_help_lists_subcommands():
    out = run(str(BIN / "materialize"), "--help")
    assert out.returncode == 0
    for command in ("run", "validate", "sample-data", "defs"):
        assert command in out.stdout
    run_help = run(str(BIN / "materialize"), "run", "--help").stdout
    for flag in ("--env", "--date", "--source", "--sink", "--redis-url", "--sql-dsn", "--data-root"):
        assert flag in run_help


def test_defs_prints_field_ids():
    out = run(str(BIN / "materialize"), "defs", "--source", "consumer_daily")
    assert out.returncode == 0, out.stderr
    line = next(l for l in out.stdout.splitlines() if l.strip().startswith("taste_embedding"))
    assert str(int.from_bytes(field_id("taste_embedding"), "little")) in line and "dimension=32" in line


def test_bad_date_and_unknown_env_are_usage_errors():
    assert run(str(BIN / "materialize"), "run", "--date", "2026-13-01").returncode == 2
    out = run(str(BIN / "materialize"), "run", "--env", "nowhere", "--date", "2026-11-20")
    assert out.returncode == 2 and "unknown env 'nowhere'" in out.stderr


def test_spark_submit_runs_the_job_into_both_stores(sample_root, redis_server, redis_db, pg_server, pg_db, tmp_path):
    conf = tmp_path / "conf"
    (conf / "base").mkdir(parents=True)
    (conf / "ci").mkdir()
    (conf / "ci" / "m.yaml").write_text(
        f"data_root: {sample_root}\nreports_dir: {tmp_path / 'reports'}\nquarantine_root: {tmp_path / 'q'}\n"
        f"redis:\n  url: {redis_server.url}\n  sample_entities: 20\n"
        "quality:\n  max_bad_fraction: 0.05\n"
    )
    jars = ",".join(str(ROOT / "jars" / j) for j in ("delta-spark_4.2_2.13-4.4.0.jar", "delta-storage-4.4.0.jar"))
    out = run(
        str(BIN / "spark-submit"), "--master", "local[2]", "--jars", jars,
        str(ROOT / "jobs" / "materialize.py"), "--env", "ci", "--date", DAY2_STR, "--source", "store_features_long",
        "--sink", "all", "--sql-dsn", pg_server.dsn,
        env={"FM_CONF_DIR": str(conf), "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "succeeded" in out.stdout
    raw = redis_db.hget("s:st00001", field_id("_ts:store_features_long"))
    assert decode("int", raw) == 1795219200  # end of 2026-11-20 UTC
    row = pg_db.execute("SELECT source, as_of FROM store_features WHERE entity_key = 'st00001'").fetchone()
    assert row == ("store_features_long", dt.datetime(2026, 11, 21, tzinfo=dt.UTC))
    report = json.loads((tmp_path / "reports" / "store_features_long" / DAY2_STR / "summary.json").read_text())
    assert report["sinks"]["cockroach"]["rows_upserted"] == report["sinks"]["redis"]["entities"] == report["entities"]


def test_sink_flag_and_password_in_dsn(tmp_path):
    out = run(str(BIN / "materialize"), "run", "--date", DAY2_STR, "--sink", "mongo")
    assert out.returncode == 2 and "invalid choice: 'mongo'" in out.stderr
    for dsn in ("password=hunter2 host=db", "postgresql://u:hunter2@db:26257/f", "host=db sslpassword=hunter2"):
        out = run(str(BIN / "materialize"), "run", "--date", DAY2_STR, "--sql-dsn", dsn)
        assert out.returncode == 2 and "dsn contains a password" in out.stderr and "hunter2" not in out.stderr
    out = run(str(BIN / "materialize"), "run", "--date", DAY2_STR, "--sql-dsn", "postgresql://app:hunter2%zz@db/f")
    assert out.returncode == 2 and "dsn is not a valid" in out.stderr and "hunter2" not in out.stderr
