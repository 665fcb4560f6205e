"""The command line as a user runs it: the console script (spark-submit: tests/test_spark_cluster.py)."""

from __future__ import annotations

from serializers import field_id

from .support.cli import BIN, run
from .support.samples import DAY2_STR


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
    line = next(text for text in out.stdout.splitlines() if text.strip().startswith("taste_embedding"))
    assert str(int.from_bytes(field_id("taste_embedding"), "little")) in line and "dimension=32" in line


def test_bad_date_and_unknown_env_are_usage_errors():
    assert run(str(BIN / "materialize"), "run", "--date", "2026-13-01").returncode == 2
    out = run(str(BIN / "materialize"), "run", "--env", "nowhere", "--date", "2026-11-20")
    assert out.returncode == 2 and "unknown env 'nowhere'" in out.stderr


def test_sink_flag_and_password_in_dsn(tmp_path):
    out = run(str(BIN / "materialize"), "run", "--date", DAY2_STR, "--sink", "mongo")
    assert out.returncode == 2 and "invalid choice: 'mongo'" in out.stderr
    for dsn in ("password=hunter2 host=db", "postgresql://u:hunter2@db:26257/f", "host=db sslpassword=hunter2"):
        out = run(str(BIN / "materialize"), "run", "--date", DAY2_STR, "--sql-dsn", dsn)
        assert out.returncode == 2 and "dsn contains a password" in out.stderr and "hunter2" not in out.stderr
    out = run(str(BIN / "materialize"), "run", "--date", DAY2_STR, "--sql-dsn", "postgresql://app:hunter2%zz@db/f")
    assert out.returncode == 2 and "dsn is not a valid" in out.stderr and "hunter2" not in out.stderr
