"""Secrets come from env vars or files named in config, and never show up anywhere else."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import psycopg
import pytest
import redis
from pyspark import cloudpickle
from pyspark.sql.classic.dataframe import DataFrame

from fm_config import ConfigError, load_config
from jobs.cli import main
from sinks.redis.config import redis_sink_config
from throwaway.servers import start_redis

from .expected import entity_count
from .support.confs import env_conf
from .support.samples import DAY2_STR

REDIS_SECRET = "r3dis-S3cret-7f1c0e"
SQL_SECRET = "pg-S3cret-91ab44"
WRONG_SECRET = "wr0ng-S3cret-5d2e99"
SECRETS = (REDIS_SECRET, SQL_SECRET, WRONG_SECRET)
ROLE = "fm_secret_test"


def require_password_for(pg_server, role: str) -> None:
    """pg_hba: this role must log in with a password (the test server trusts everyone else)."""
    hba = pg_server.data_dir / "pg_hba.conf"
    line = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
    text = hba.read_text()
    if line not in text:
        hba.write_text(line + text)
    with pg_server.connect() as conn:
        conn.execute("SELECT pg_reload_conf()")


@pytest.fixture
def secret_env(spark, sample_root, pg_server, pg_db, tmp_path, monkeypatch):
    server = start_redis(tmp_path / "redis", "--requirepass", REDIS_SECRET, "--maxmemory", "256mb")
    require_password_for(pg_server, ROLE)
    pg_db.execute(f"DROP OWNED BY {ROLE}" if pg_db.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone() else "SELECT 1")
    pg_db.execute(f"DROP ROLE IF EXISTS {ROLE}")
    pg_db.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{SQL_SECRET}'")  # test-owned literal
    pg_db.execute(f"GRANT ALL ON SCHEMA public TO {ROLE}")
    secret_file = tmp_path / "secrets" / "sql_password"
    secret_file.parent.mkdir()
    secret_file.write_text(SQL_SECRET + "\n")
    # Redis's as a mounted file too: this session's executors started before the test, so
    # an env var set now would not reach them (test_executors_read_the_env_var_themselves)
    (tmp_path / "secrets" / "redis_password").write_text(REDIS_SECRET)
    folder = env_conf(
        tmp_path / "conf",
        "sec",
        f"data_root: {sample_root}\nledger_root: {tmp_path / 'out' / 'ledger'}\nquarantine_root: {tmp_path / 'out' / 'q'}\n"
        f"reports_dir: {tmp_path / 'out' / 'reports'}\nsinks: [redis, sql]\n"
        "spark: {shuffle_partitions: 2, arrow_batch_rows: 256}\n"
        f"redis: {{url: '{server.url}', password_env: null, "
        f"password_file: '{tmp_path / 'secrets' / 'redis_password'}', sample_entities: 50}}\n"
        f"sql: {{dsn: 'postgresql://{ROLE}@127.0.0.1:{pg_server.port}/features', password_file: '{secret_file}'}}\n"
        "quality: {max_bad_fraction: 0.05, expectations: false, verify_sample: 50}\n",
    )
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    yield tmp_path, server
    server.stop()


def every_file_under(root: Path, skip: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and skip not in p.parents]


def test_known_secrets_never_reach_outputs_reports_errors_plans_or_the_event_log(
    secret_env, capfd, caplog, monkeypatch, pg_server, spark_events
):
    tmp_path, server = secret_env
    caplog.set_level(logging.INFO)
    shipped: list[bytes] = []  # what the executors are sent: the partition functions and their write plans, pickled
    original = DataFrame.mapInArrow

    def recording(self, func, *args, **kwargs):
        shipped.append(cloudpickle.dumps(func))
        return original(self, func, *args, **kwargs)

    monkeypatch.setattr(DataFrame, "mapInArrow", recording)
    run = ["run", "--env", "sec", "--date", DAY2_STR, "--source", "consumer_daily"]
    assert main(run) == 0
    # the secrets worked: both stores hold the snapshot
    authed = redis.Redis(host="127.0.0.1", port=server.port, password=REDIS_SECRET)
    assert entity_count(authed) > 0
    with psycopg.connect(pg_server.dsn) as conn:
        assert conn.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == entity_count(authed)

    # the plans named where the passwords are; each writer read them there
    plans = b"".join(shipped)
    assert len(shipped) >= 2 and b"redis_password" in plans and b"sql_password" in plans

    # a wrong password fails the run, saying which server refused, never what was tried
    (tmp_path / "secrets" / "redis_password").write_text(WRONG_SECRET)
    assert main(run) == 1
    (tmp_path / "secrets" / "redis_password").write_text(REDIS_SECRET)
    (tmp_path / "secrets" / "sql_password").write_text(WRONG_SECRET)
    assert main(run) == 7  # a login refused: not worth a retry (exit_codes.EXIT_TERMINAL)
    failed = capfd.readouterr()
    assert "WRONGPASS" in failed.err or "invalid username-password" in failed.err
    assert f'password authentication failed for user "{ROLE}"' in failed.err

    for command in ("run", "backfill", "verify", "cleanup", "validate", "runs", "report", "defs", "ready", "sample-data", "schema"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
    assert main(["runs", "--env", "sec"]) == 0
    assert main(["report", "--env", "sec", "--source", "consumer_daily", "--date", DAY2_STR]) == 1  # the last run failed

    out = capfd.readouterr()
    texts = {"stdout": out.out, "stderr": out.err, "log records": caplog.text}
    texts |= {str(p): p.read_bytes().decode("utf-8", "replace") for p in every_file_under(tmp_path / "out", skip=tmp_path / "secrets")}
    texts |= {f"pickled plan {i}": plan.decode("latin-1") for i, plan in enumerate(shipped)}
    texts |= {f"event log {p.name}": p.read_bytes().decode("utf-8", "replace") for p in spark_events.rglob("*") if p.is_file()}
    assert any("summary.json" in name for name in texts) and any("_delta_log" in name for name in texts)
    assert any("SparkListenerJobEnd" in text for name, text in texts.items() if name.startswith("event log"))
    leaks = [(name, secret) for name, text in texts.items() for secret in SECRETS if secret in text]
    assert leaks == []


def test_password_file_and_env_are_exclusive_and_literals_refused(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "conf"
    (folder / "base").mkdir(parents=True)
    (folder / "x").mkdir()
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    (folder / "x" / "m.yaml").write_text("sql:\n  password_env: PW\n  password_file: /nonexistent\n")
    with pytest.raises(ConfigError, match="sql.password_env and sql.password_file are both set"):
        load_config("x").sql_password()
    # a higher layer naming a file replaces the env var a lower layer named (conf/base names FM_*_PASSWORD)
    (folder / "base" / "m.yaml").write_text("sql:\n  password_env: FM_SQL_PASSWORD\n")
    (folder / "x" / "m.yaml").write_text(f"sql:\n  password_file: {tmp_path / 'pw'}\n")
    (tmp_path / "pw").write_text("from-the-file\n")
    assert load_config("x").sql_password().get_secret_value() == "from-the-file"
    (folder / "base" / "m.yaml").write_text("")
    (folder / "x" / "m.yaml").write_text("sql:\n  password_file: /nonexistent/pw\n")
    with pytest.raises(ConfigError, match="sql.password_file '/nonexistent/pw' cannot be read"):
        load_config("x").sql_password()
    (folder / "x" / "m.yaml").write_text(f"redis:\n  url: redis://user:{REDIS_SECRET}@127.0.0.1:6379/0\n")
    with pytest.raises(ConfigError) as info:
        load_config("x")
    assert "m.yaml:2" in str(info.value) and "url contains a password" in str(info.value) and REDIS_SECRET not in str(info.value)
    (folder / "x" / "m.yaml").write_text(f"redis:\n  url: redis://127.0.0.1:6379/0?password={REDIS_SECRET}\n")
    with pytest.raises(ConfigError) as info:
        load_config("x")  # redis-py would take it from the query
    assert "m.yaml:2" in str(info.value) and "url contains a password" in str(info.value) and REDIS_SECRET not in str(info.value)
    (folder / "x" / "m.yaml").write_text(f"redis:\n  password: {REDIS_SECRET}\n")
    with pytest.raises(ConfigError) as info:
        load_config("x")
    assert "m.yaml:2" in str(info.value) and "password_file" in str(info.value) and REDIS_SECRET not in str(info.value)
    (folder / "x" / "m.yaml").write_text("")
    capsys.readouterr()
    assert main(["run", "--env", "x", "--date", DAY2_STR, "--redis-url", f"redis://:{REDIS_SECRET}@h:1/0"]) == 2
    err = capsys.readouterr().err
    assert "url contains a password" in err and REDIS_SECRET not in err


def test_executors_read_the_env_var_themselves(tmp_path, monkeypatch):
    """A write plan from a conf naming password_env holds the variable's name, not its value;
    another process (an executor) reads the value from its own environment, and one without
    the variable is told which one it lacks."""
    import pickle
    import subprocess
    import sys

    from fm_config import PROJECT_ROOT

    folder = env_conf(tmp_path / "conf", "envsec", "redis: {url: 'redis://127.0.0.1:1/0', password_env: FM_TEST_EXECUTOR_PASSWORD}\n")
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    monkeypatch.setenv("FM_TEST_EXECUTOR_PASSWORD", REDIS_SECRET)
    plan = pickle.dumps(redis_sink_config(load_config("envsec")))
    assert REDIS_SECRET.encode() not in plan and b"FM_TEST_EXECUTOR_PASSWORD" in plan
    (tmp_path / "plan").write_bytes(plan)
    read = "import pickle, sys; print(pickle.loads(open(sys.argv[1], 'rb').read()).auth_password())"
    env = {k: v for k, v in os.environ.items() if k != "FM_TEST_EXECUTOR_PASSWORD"}
    got = subprocess.run(
        [sys.executable, "-c", read, str(tmp_path / "plan")],
        cwd=PROJECT_ROOT,
        env={**env, "FM_TEST_EXECUTOR_PASSWORD": "its-own"},
        capture_output=True,
        text=True,
    )
    assert got.returncode == 0 and got.stdout.strip() == "its-own", got.stderr
    missing = subprocess.run(
        [sys.executable, "-c", read, str(tmp_path / "plan")], cwd=PROJECT_ROOT, env=env, capture_output=True, text=True
    )
    assert (
        missing.returncode == 1
        and "redis.password_env names 'FM_TEST_EXECUTOR_PASSWORD', but that environment variable is not set" in missing.stderr
    )
