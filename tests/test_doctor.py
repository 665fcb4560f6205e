"""``materialize doctor``: each check against the real servers and tables, what it says when
something is wrong, and that it writes nothing anywhere."""

from __future__ import annotations

import re
from pathlib import Path

from fm_config import SparkConf
from fm_config.reader import ServerSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.operations.doctor import run_checks
from serializers.resp import WRITE_SCRIPT_SHA
from throwaway.servers import free_port

from .conftest import env_conf, tiny_consumer_source
from .test_cli import BIN, run
from .test_redis_job import DEFS

SOURCES = list(DEFS.sources)


def checks_of(conf, defs=DEFS, sources=SOURCES):
    return {c.name: c for c in run_checks(conf, defs, sources, list(conf.sinks))}


def test_a_ready_deployment_passes_every_check_and_nothing_is_written(sample_root, sql_conf, redis_db, pg_db, tmp_path):
    redis_db.script_flush()  # other tests loaded the write script: the check must not
    conf = sql_conf.model_copy(
        update={"sinks": ["redis", "cockroach"], "ledger_root": str(tmp_path / "ledger"), "spark": SparkConf(master="local[2]"),
                "server": ServerSettings(port=free_port())}
    )  # fmt: skip
    checks = checks_of(conf)
    assert {n: c.status for n, c in checks.items()} == dict.fromkeys(
        ["java", "delta jars", "source consumer_daily", "source store_features_long", "ledger", "leases", "quarantine", "reports",
         "redis", "redis memory", "redis listpack", "redis acl consumer", "redis acl store", "sql",
         "sql table consumer_features", "sql table store_features", "server port", "server auth"],
        "ok",
    )  # fmt: skip
    info = redis_db.info("memory")
    assert f"of {int(info['maxmemory']):,} B used" in checks["redis memory"].detail and info["maxmemory"] == 256 * 2**20
    # consumer: the consumer_daily features and a freshness field; store: the long source's
    consumer = len(DEFS.source("consumer_daily").features) + 1
    assert f"consumer {consumer} fields" in checks["redis listpack"].detail and "value 256" in checks["redis listpack"].detail
    assert "not there yet; this role may create it" in checks["sql table consumer_features"].detail
    assert str(sample_root / "consumer_daily") in checks["source consumer_daily"].detail

    # nothing written: no key, no script loaded, no table, no ledger, quarantine or reports
    assert redis_db.dbsize() == 0 and redis_db.script_exists(WRITE_SCRIPT_SHA) == [False]
    assert pg_db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0
    assert not any(Path(p).exists() for p in (conf.ledger_path, str(conf.ledger_path) + "_leases", conf.quarantine_path, conf.reports_path))


def test_a_table_that_drifted_from_its_definition_is_named_with_the_column(spark, run_conf, tmp_path):
    defs = tiny_consumer_source(
        spark, tmp_path, "    - {name: orders_7d, type: int}\n", "consumer_id long, orders_8d int, ds date", [(1, 2, None)]
    )
    conf = run_conf.model_copy(update={"data_root": str(tmp_path)})
    check = checks_of(conf, defs, ["tiny"])["source tiny"]
    assert check.status == "fail" and "column 'orders_7d' is missing" in check.detail and "feature_defs" in check.fix
    missing = checks_of(conf.model_copy(update={"data_root": str(tmp_path / "nowhere")}), defs, ["tiny"])["source tiny"]
    assert missing.status == "fail" and f"no Delta table at {tmp_path / 'nowhere' / 'tiny'}" == missing.detail


def test_redis_user_rights_memory_and_eviction_are_checked(sample_root, run_conf, acl_redis, tmp_path):
    server, password = acl_redis
    (tmp_path / "pw").write_text(password)
    user = RedisSettings(url=server.url, username="fm_writer", password_file=str(tmp_path / "pw"), hash_max_listpack_value=256)
    conf = run_conf.model_copy(update={"redis": user})
    checks = checks_of(conf)
    # the documented ACL (conf/base/redis-acl.txt) is enough; CONFIG GET is refused, the conf's values stand in
    assert {
        n: checks[n].status for n in ("redis", "redis memory", "redis listpack", "redis acl consumer", "redis acl store")
    } == dict.fromkeys(("redis", "redis memory", "redis listpack", "redis acl consumer", "redis acl store"), "ok"), [
        c for c in checks.values() if c.status != "ok"
    ]

    admin = server.client()
    # without MULTI: the commands that do nothing on a missing key are run, HSET and SCRIPT LOAD untried
    admin.execute_command("ACL", "SETUSER", "fm_writer", "-multi")
    acl = checks_of(conf)["redis acl store"]
    assert acl.status == "warn" and acl.detail.endswith("on s:* except SCRIPT LOAD, HSET, which were not tried (MULTI refused)")
    admin.execute_command("ACL", "SETUSER", "fm_writer", "-hdel")
    assert checks_of(conf)["redis acl store"].detail == "user fm_writer may not run HDEL on s:*"

    admin.execute_command("ACL", "SETUSER", "fm_writer", "+multi", "+hdel", "-hset", "-evalsha")
    admin.config_set("maxmemory-policy", "allkeys-lru")
    checks = checks_of(conf.model_copy(update={"redis": user.model_copy(update={"max_fill": 0.0001})}))
    acl = checks["redis acl consumer"]
    assert acl.status == "fail" and acl.detail == "user fm_writer may not run EVALSHA, HSET on c:*" and "Least privilege" in acl.fix
    used = int(admin.info("memory")["used_memory"])
    reported, capacity = (int(n.replace(",", "")) for n in re.match(r"([\d,]+) of ([\d,]+) B used", checks["redis memory"].detail).groups())
    assert checks["redis memory"].status == "fail" and capacity == 256 * 2**20 and abs(reported - used) < used / 10
    assert checks["redis eviction"].status == "fail" and "allkeys-lru" in checks["redis eviction"].detail
    assert admin.dbsize() == 0 and admin.script_exists(WRITE_SCRIPT_SHA) == [False]

    down = checks_of(run_conf.model_copy(update={"redis": RedisSettings(url=f"redis://127.0.0.1:{free_port()}/0")}))["redis"]
    assert down.status == "fail" and "cannot connect" in down.detail and "redis.url" in down.fix


def test_sql_tables_and_grants_are_checked_for_the_writer_role(sample_root, sql_conf, pg_db, sql_roles, tmp_path):
    writer = SqlSettings(dsn=sql_roles["fm_writer"], password_file=str(tmp_path / "fm_writer_password"))
    conf = sql_conf.model_copy(update={"sql": writer, "env": "prod"})
    table = checks_of(conf)["sql table store_features"]
    assert (
        table.status == "fail"
        and "missing (or this role holds no privilege" in table.detail
        and "materialize schema --env prod" in table.fix
    )
    pg_db.execute("CREATE TABLE store_features (entity_key text, source text, features jsonb, as_of bigint, updated_at timestamptz)")
    pg_db.execute("GRANT SELECT ON store_features TO fm_writer")
    table = checks_of(conf)["sql table store_features"]
    assert table.status == "fail" and table.detail == "store_features: this role lacks INSERT, UPDATE"
    assert pg_db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 1


def test_cli_prints_one_line_per_check_and_fails_on_any_failure(sample_root, tmp_path):
    port = free_port()
    folder = env_conf(
        tmp_path / "conf", "dr",
        f"data_root: {sample_root}\nreports_dir: {tmp_path / 'reports'}\nsinks: [redis]\n"
        f"spark:\n  master: spark://127.0.0.1:{port}\nredis:\n  url: redis://127.0.0.1:{port}/0\nserver:\n  port: {free_port()}\n",
    )  # fmt: skip
    out = run(str(BIN / "materialize"), "doctor", "--env", "dr", env={"FM_CONF_DIR": str(folder)})
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("materialize doctor: env dr, 2 source(s), stores redis")
    assert lines[1].split()[:2] == ["FAIL", "spark"] and f"spark://127.0.0.1:{port}: no master answers" in lines[1]
    assert lines[2].strip().startswith("fix: start the standalone master")
    assert any(line.startswith("OK    source consumer_daily") for line in lines)
    assert any(line.startswith("FAIL  redis ") and "cannot connect" in line for line in lines)
    assert lines[-1] == "10 checks: 8 ok, 0 warning(s), 2 failed"  # the server's port and auth among the ok


def test_a_ledger_on_s3_without_a_multi_driver_log_store_is_a_warning():
    from fm_config import RunConf
    from jobs.operations.doctor import check_log_store

    [check] = check_log_store(RunConf(ledger_root="s3a://lake/_ledger"))
    assert check.status == "warn" and "single-driver log store" in check.detail and "S3DynamoDBLogStore" in check.fix
    dynamo = SparkConf(extra={"spark.delta.logStore.s3a.impl": "io.delta.storage.S3DynamoDBLogStore"})
    assert [c.status for c in check_log_store(RunConf(ledger_root="s3a://lake/_ledger", spark=dynamo))] == ["ok"]
    assert check_log_store(RunConf(ledger_root="gs://lake/_ledger")) == check_log_store(RunConf()) == []
