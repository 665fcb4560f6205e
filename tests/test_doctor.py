"""``materialize doctor``: each check against the real servers and tables, what it says when
something is wrong, and that it writes nothing anywhere."""

from __future__ import annotations

import re
from pathlib import Path

import redis

from feature_defs import DEFAULT_DIR as DEFS_DIR
from feature_defs import load_definitions
from fm_config import RunConf, SparkConf
from fm_config.reader import ReaderSettings, ServerSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.operations.doctor.run import run_checks
from jobs.operations.schema import ensure_tables
from serializers.resp import WRITE_SCRIPT_SHA
from throwaway.servers import free_port, start_redis

from .support.cli import BIN, run
from .support.confs import env_conf
from .support.events import SOURCE as EVENTS
from .support.privileges import ACL_FILE
from .support.samples import tiny_consumer_source
from .support.tls import start_tls_redis

DEFS = load_definitions()
SOURCES = list(DEFS.sources)


def checks_of(conf, defs=DEFS, sources=SOURCES):
    return {c.name: c for c in run_checks(conf, defs, sources, list(conf.sinks))}


def test_a_ready_deployment_passes_every_check_and_nothing_is_written(sample_root, sql_conf, redis_db, pg_db, tmp_path):
    redis_db.script_flush()  # other tests loaded the write script: the check must not
    conf = sql_conf.model_copy(
        update={"sinks": ["redis", "sql"], "ledger_root": str(tmp_path / "ledger"), "spark": SparkConf(master="local[2]"),
                "server": ServerSettings(port=free_port())}
    )  # fmt: skip
    checks = checks_of(conf)
    assert {n: c.status for n, c in checks.items()} == dict.fromkeys(
        ["java", "delta jars", "source consumer_daily", "source store_features_long", "ledger", "leases", "quarantine", "reports",
         "redis transport", "redis", "redis memory", "redis listpack", "redis acl consumer", "redis acl store", "sql",
         "sql table consumer_features", "sql table store_features", "redis description", "sql description", "server port",
         "server auth", "push"],
        "ok",
    ) | dict.fromkeys(
        # ready to run, not to serve: no reader credentials, no keys or tables yet, a Redis without
        # persistence whose default user is open (loopback: warnings)
        ["reader redis", "redis keys", "redis persistence", "redis default user",
         "reader sql", "reader sql consumer_features", "reader sql store_features"],
        "warn",
    )  # fmt: skip
    # the suite's PostgreSQL user is a superuser, as the local demo's: said plainly
    assert checks["reader sql"].detail == (
        "reader.sql is not set: reads run as postgres, the writer's role, which is a superuser: it may write every table, "
        "and files and programs on the server"
    )
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
    # a table made before expires_at (the entity TTL's): the schema step brings it up
    assert table.status == "fail" and table.detail == "store_features: no column(s) expires_at; this role lacks INSERT, UPDATE"
    assert table.fix.startswith("run `materialize schema --env prod` under the table owner")
    pg_db.execute("ALTER TABLE store_features ADD COLUMN expires_at timestamptz")
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
    assert any(line.startswith("OK    push ") and "off (server.push.enabled: false)" in line for line in lines)
    assert lines[-1] == "11 checks: 9 ok, 0 warning(s), 2 failed"  # the server's port and auth, and push off, among the ok


def test_a_ledger_on_s3_without_a_multi_driver_log_store_is_a_warning():
    from fm_config import RunConf
    from jobs.operations.doctor.locations import check_log_store

    [check] = check_log_store(RunConf(ledger_root="s3a://lake/_ledger"))
    assert check.status == "warn" and "single-driver log store" in check.detail and "S3DynamoDBLogStore" in check.fix
    dynamo = SparkConf(extra={"spark.delta.logStore.s3a.impl": "io.delta.storage.S3DynamoDBLogStore"})
    assert [c.status for c in check_log_store(RunConf(ledger_root="s3a://lake/_ledger", spark=dynamo))] == ["ok"]
    assert check_log_store(RunConf(ledger_root="gs://lake/_ledger")) == check_log_store(RunConf()) == []


# -- the read side (jobs/operations/doctor/reads.py) ----------------------------------------

READ_SIDE = ("reader redis", "redis keys", "redis persistence", "redis default user")


def acl_grants(user: str) -> set[str]:
    """The commands conf/base/redis-acl.txt grants ``user`` (upper case), read from the file."""
    line = next(line.split() for line in ACL_FILE.read_text().splitlines() if line.split()[2] == user)
    return {a[1:].upper() for a in line if a.startswith("+")}


def write_surface(admin: redis.Redis) -> set[str]:
    """What a reader's user must not run, as the server lists it: its @write and @dangerous
    commands, INFO aside (fm_reader's ACL grants it), EVALSHA added (the writer's)."""
    listed = {n.decode() for cat in ("write", "dangerous") for n in admin.execute_command("COMMAND LIST", "FILTERBY", "ACLCAT", cat)}
    return listed - {"info"} | {"evalsha"}


def test_the_readers_credentials_are_checked_can_read_and_cannot_write(run_conf, acl_redis, tmp_path):
    server, password = acl_redis
    admin = server.client()
    admin.acl_log_reset()
    (tmp_path / "pw").write_text(password)
    as_reader = {"username": "fm_reader", "password_file": str(tmp_path / "pw")}
    conf = run_conf.model_copy(update={"redis": RedisSettings(url=server.url, password_env=None), "sinks": ["redis"]})

    def reader_check(redis_settings, reader_redis):
        with_reader = conf.model_copy(update={"redis": redis_settings, "reader": ReaderSettings(redis=reader_redis)})
        return [c for c in run_checks(with_reader, DEFS, SOURCES, ["redis"]) if c.name == "reader redis"]

    # the server's default user (no password, every command) may run ACL DRYRUN: it judges
    surface = write_surface(admin)
    [ok] = reader_check(conf.redis, as_reader)
    assert (ok.status, ok.detail) == (
        "ok", f"user fm_reader may read c:* and s:* and may run none of the {len(surface)} @write and @dangerous commands "
        "(ACL DRYRUN as default)")  # fmt: skip
    # the writer's user as the reader's: what it may write is what its ACL line grants
    writes = sorted(acl_grants("fm_writer") & {name.upper() for name in surface})
    assert writes == ["EVALSHA", "EXPIRE", "HDEL", "HSET", "PERSIST"]
    [bad] = reader_check(conf.redis, {**as_reader, "username": "fm_writer"})
    assert (bad.status, bad.detail) == (
        "fail", f"reader.redis user fm_writer may write with {', '.join(writes)}: reads need none of that (ACL DRYRUN as default)"
    )  # fmt: skip
    assert "conf/base/redis-acl.txt" in bad.fix
    writer = RedisSettings(url=server.url, username="fm_writer", password_file=str(tmp_path / "pw"))
    [unset] = reader_check(writer, None)
    assert unset.status == "warn" and unset.detail.startswith(
        "reader.redis is not set: reads run as fm_writer, the writer's user, which may also write"
    )
    admin.execute_command("ACL", "SETUSER", "fm_reader", "-hmget")
    [unreadable] = reader_check(conf.redis, as_reader)
    assert unreadable.status == "fail" and unreadable.detail == "user fm_reader may not run HMGET on c:*, s:*: reads fail"
    (tmp_path / "pw").write_text("not-" + password)
    [refused] = reader_check(conf.redis, as_reader)
    assert (
        refused.status == "fail" and "user fm_reader: authentication refused" in refused.detail and "reader.redis.username" in refused.fix
    )
    assert password not in refused.detail
    # nothing was written, and what was refused was refused before it ran
    assert admin.dbsize() == 0
    # ACL DRYRUN is asked of the reader's user first; COMMAND LIST of fm_writer as the reader (another user lists them)
    probes = {"hmget", "scan", "config|get", "acl|dryrun", "command|list"}
    assert {e["object"] for e in admin.acl_log() if e["reason"] == "command"} <= probes


def test_the_readers_sql_role_is_checked_can_read_and_cannot_write(run_conf, sql_roles, pg_db):
    # fm_reader may only SELECT the tables the schema step made
    owner = SqlSettings(dsn=sql_roles["fm_schema"], password_env="FM_TEST_FM_SCHEMA_PASSWORD")
    sql_conf = run_conf.model_copy(
        update={"sql": SqlSettings(dsn=sql_roles["fm_writer"], password_env="FM_TEST_FM_WRITER_PASSWORD"), "sinks": ["sql"]}
    )
    assert ensure_tables(sql_conf.model_copy(update={"sql": owner}), DEFS, ["consumer_daily"]) == {"consumer_features": "created"}

    def sql_checks(reader_sql):
        with_reader = sql_conf.model_copy(update={"reader": ReaderSettings(sql=reader_sql)})
        return {c.name: c for c in run_checks(with_reader, DEFS, SOURCES, ["sql"]) if c.name.startswith("reader sql")}

    as_sql_reader = {"user": "fm_reader", "password_env": "FM_TEST_FM_READER_PASSWORD"}
    checks = sql_checks(as_sql_reader)
    assert (checks["reader sql consumer_features"].status, checks["reader sql consumer_features"].detail) == (
        "ok", "role fm_reader may SELECT from consumer_features and nothing more (no other privilege on it, not its owner)")  # fmt: skip
    assert (checks["reader sql"].status, checks["reader sql"].detail) == (
        "ok", "role fm_reader is not a superuser nor a member of pg_write_server_files or pg_execute_server_program")  # fmt: skip
    assert (
        checks["reader sql store_features"].status == "warn"
        and "store_features is not there yet" in checks["reader sql store_features"].detail
    )
    assert sql_checks(None)["reader sql consumer_features"].detail == (
        "reader.sql is not set: reads run as fm_writer, the writer's role, which may INSERT, UPDATE consumer_features"
    )
    wrong = sql_checks({**as_sql_reader, "user": "fm_writer", "password_env": "FM_TEST_FM_WRITER_PASSWORD"})["reader sql consumer_features"]
    assert (
        wrong.status == "fail" and wrong.detail == "reader.sql role fm_writer may INSERT, UPDATE consumer_features: reads need only SELECT"
    )
    pg_db.execute("REVOKE SELECT ON consumer_features FROM fm_reader")
    revoked = sql_checks(as_sql_reader)["reader sql consumer_features"]
    assert revoked.status == "fail" and revoked.detail == "role fm_reader may not SELECT from consumer_features: reads fail"
    assert pg_db.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == 0


# commands without keys that doctor_rights.py tries in a form their own checks refuse, or that only reads
KEYLESS_TRIED = {
    "flushall", "flushdb", "swapdb", "config|set", "function|delete", "function|flush", "function|load", "function|restore",
    "acl|deluser", "acl|dryrun", "acl|log", "client|kill", "client|unblock", "client|pause", "client|no-evict", "client|list",
    "bgsave", "replicaof", "slaveof", "failover", "latency|reset", "config|get", "acl|getuser", "latency|history", "latency|graph",
    "latency|histogram", "acl|users", "acl|list", "slowlog|len", "lastsave", "role", "latency|latest", "latency|doctor", "module|list",
}  # fmt: skip


def test_a_readers_redis_user_is_judged_on_every_write_and_dangerous_command(acl_redis, tmp_path):
    from jobs.operations.doctor.reads import check_reader_redis

    server, password = acl_redis
    (tmp_path / "pw").write_text(password)
    admin = redis.Redis(host="127.0.0.1", port=server.port, username="admin", password=password)
    server.client().execute_command("ACL", "SETUSER", "admin", "on", ">" + password, "~*", "&*", "+@all")
    surface = write_surface(admin)
    infos = dict(zip(sorted(surface), admin.execute_command("COMMAND INFO", *sorted(surface))))
    writes = sorted(n for n in surface if b"@write" in infos[n][6] or n == "evalsha")

    def judged(user: str, *rules: str):
        if rules:
            admin.execute_command("ACL", "SETUSER", user, "reset", "on", ">" + password, *rules)
        reader = ReaderSettings(redis={"username": user, "password_file": str(tmp_path / "pw")})
        conf = RunConf(redis=RedisSettings(url=server.url, password_env=None), sinks=["redis"], reader=reader)
        [check], _ = check_reader_redis(conf, DEFS, SOURCES)
        return check.status, check.detail

    # the reader: FLUSHALL, RENAME, HINCRBY and CONFIG GET besides its reads
    loose = ("resetkeys", "~c", "~c:*", "~s", "~s:*", "-@all", "+hmget", "+ping", "+command", "+flushall", "+rename", "+hincrby",
             "+config|get")  # fmt: skip
    said = "may write with FLUSHALL, HINCRBY, RENAME and run @dangerous CONFIG GET: reads need none of that"
    # judged by ACL DRYRUN as the server's default user (no password, every command)
    assert judged("loose", *loose) == ("fail", f"reader.redis user loose {said} (ACL DRYRUN as default)")
    # no user here may run ACL DRYRUN (the default user off; the writer's user is the same default): each command tried
    admin.execute_command("ACL", "SETUSER", "default", "off")
    tried = "each tried where Redis refuses it before it runs"
    assert judged("loose") == ("fail", f"reader.redis user loose {said} ({tried})")
    # the documented reader passes; the commands without keys and without a refused form are named as not tried
    untried = sorted(n for n in surface if infos[n][3] == 0 and b"movablekeys" not in infos[n][2] and n not in KEYLESS_TRIED)
    status, detail = judged("fm_reader")
    assert status == "ok" and detail.startswith(
        f"user fm_reader may read c:* and s:* and may run none of the {len(surface) - len(untried)} @write and @dangerous commands "
        f"({tried}); {len(untried)} commands without keys ("
    ), detail
    assert detail.endswith(") were not tried: only ACL DRYRUN judges them without running them, and no user here may run it")
    # a user that may run every command but ACL DRYRUN, on keys it may only read: every probe refused before it runs
    admin.execute_command("ACL", "SETUSER", "wide", "on", ">" + password, "resetkeys", "%R~c", "%R~c:*", "%R~s", "%R~s:*", "+@all",
                          "-acl|dryrun")  # fmt: skip
    config, users = admin.config_get("*"), admin.acl_users()
    status, detail = judged("wide")
    shown = [n.replace("|", " ").upper() for n in writes[:10]]
    assert status == "fail" and detail.startswith(f"reader.redis user wide may write with {', '.join(shown)} and {len(writes) - 10} more")
    assert admin.dbsize() == 0 and admin.config_get("*") == config and admin.acl_users() == users
    assert admin.execute_command("FUNCTION LIST") == [] and admin.script_exists(WRITE_SCRIPT_SHA) == [False]
    # keys it may read anywhere: a write command could run on any key, so none is tried
    status, detail = judged("everywhere", "resetkeys", "%R~*", "-@all", "+hmget", "+ping", "+command")
    assert status == "warn" and "@write commands" in detail and "this user may read keys outside its prefixes" in detail
    assert admin.dbsize() == 0


def test_a_readers_sql_role_is_judged_on_every_privilege_ownership_and_the_file_roles(run_conf, sql_roles, pg_db):
    from jobs.operations.doctor.reads import check_reader_sql

    owner = SqlSettings(dsn=sql_roles["fm_schema"], password_env="FM_TEST_FM_SCHEMA_PASSWORD")
    conf = run_conf.model_copy(update={"sql": owner, "sinks": ["sql"]})
    assert ensure_tables(conf, DEFS, ["consumer_daily"]) == {"consumer_features": "created"}
    reader = conf.model_copy(update={"reader": ReaderSettings(sql={"user": "fm_reader", "password_env": "FM_TEST_FM_READER_PASSWORD"})})

    def judged() -> dict[str, tuple[str, str]]:
        return {c.name: (c.status, c.detail) for c in check_reader_sql(reader, DEFS, ["consumer_daily"])}

    only = "reads need only SELECT"
    pg_db.execute("GRANT TRUNCATE ON consumer_features TO fm_reader")
    pg_db.execute("GRANT UPDATE (features) ON consumer_features TO fm_reader")  # one column is enough to change rows
    pg_db.execute("GRANT pg_execute_server_program TO fm_reader")
    assert judged() == {
        "reader sql": ("fail", "reader.sql role fm_reader is a member of pg_execute_server_program: runs programs on the server "
                       f"(COPY ... TO PROGRAM): {only}"),
        "reader sql consumer_features": ("fail", f"reader.sql role fm_reader may UPDATE, TRUNCATE consumer_features: {only}"),
    }  # fmt: skip
    pg_db.execute("REVOKE TRUNCATE, UPDATE ON consumer_features FROM fm_reader")
    pg_db.execute("REVOKE UPDATE (features) ON consumer_features FROM fm_reader")
    pg_db.execute("GRANT pg_write_server_files TO fm_reader")
    pg_db.execute("ALTER TABLE consumer_features OWNER TO fm_reader")
    assert judged() == {
        "reader sql": ("fail", "reader.sql role fm_reader is a member of pg_execute_server_program: runs programs on the server "
                       "(COPY ... TO PROGRAM); is a member of pg_write_server_files: writes files on the server (COPY ... TO a file): "
                       f"{only}"),
        "reader sql consumer_features": ("fail", "reader.sql role fm_reader may INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER "
                                         f"consumer_features and owns consumer_features: {only}"),
    }  # fmt: skip
    pg_db.execute("ALTER TABLE consumer_features OWNER TO fm_schema")  # fm_reader's own grants went with the table
    pg_db.execute("GRANT SELECT ON consumer_features TO fm_reader")
    pg_db.execute("REVOKE pg_execute_server_program, pg_write_server_files FROM fm_reader")
    pg_db.execute("ALTER ROLE fm_reader SUPERUSER")
    try:
        assert judged() == {
            "reader sql": ("fail", "reader.sql role fm_reader is a superuser: it may write every table, and files and programs on the "
                           f"server: {only}"),
            "reader sql consumer_features": ("fail", f"reader.sql role fm_reader may write consumer_features (a superuser): {only}"),
        }  # fmt: skip
    finally:
        pg_db.execute("ALTER ROLE fm_reader NOSUPERUSER")
    assert judged()["reader sql consumer_features"][0] == "ok"
    assert pg_db.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == 0


def test_a_url_whose_scheme_the_port_does_not_speak_is_named(run_conf, redis_db, redis_server, certs, tmp_path):  # noqa: F811
    tls = start_tls_redis(tmp_path / "tls", certs.server_cert, certs.server_key, certs.ca)
    try:

        def transport(url, **tls_files):
            conf = run_conf.model_copy(update={"redis": RedisSettings(url=url, password_env=None, **tls_files)})
            got = [c for c in run_checks(conf, DEFS, SOURCES, ["redis"]) if c.name in ("redis transport", *READ_SIDE)]
            return got[0], [c.name for c in got[1:]]

        plain_port, tls_port = redis_server.port, tls.port
        check, rest = transport(f"rediss://127.0.0.1:{plain_port}/0", tls_ca_file=str(certs.ca))
        assert (
            check.status == "fail"
            and check.detail == f"redis.url is rediss:// but 127.0.0.1:{plain_port} answers plain Redis: no TLS on that port"
        )
        assert rest == []  # the reader's checks would only repeat the failed handshake
        check, rest = transport(f"redis://127.0.0.1:{tls_port}/0")
        assert (
            check.status == "fail"
            and check.detail == f"redis.url is redis:// but 127.0.0.1:{tls_port} speaks TLS only (it dropped a plain PING)"
        )
        assert "rediss://" in check.fix and rest == []
        check, rest = transport(f"rediss://127.0.0.1:{tls_port}/0", tls_ca_file=str(certs.ca))
        assert (check.status, check.detail) == ("ok", f"127.0.0.1:{tls_port}: TLS, as redis.url says") and rest == list(READ_SIDE)
        check, rest = transport(f"redis://127.0.0.1:{plain_port}/0")
        assert (check.status, check.detail) == ("ok", f"127.0.0.1:{plain_port}: plain Redis, as redis.url says") and rest == list(READ_SIDE)
    finally:
        tls.process.terminate()
        tls.process.wait(timeout=10)


def test_a_database_without_the_projects_keys_is_named(run_conf, redis_server, redis_db, acl_redis, tmp_path):
    def keys_check(conf):
        return next(c for c in run_checks(conf, DEFS, SOURCES, ["redis"]) if c.name == "redis keys")

    conf = run_conf.model_copy(update={"redis": RedisSettings(url=redis_server.url, password_env=None)})
    empty = keys_check(conf)
    assert (empty.status, empty.detail) == ("warn", "database 0 is empty: no run has written it yet, or reads look in the wrong place")
    redis_server.client(3).hset("c:1", "f", "v")  # written to another database than the URL's
    assert keys_check(conf).detail.endswith("(keys are in: db 3 1)")
    for n in range(3000):
        redis_db.set(f"other:{n}", "x")
    other = keys_check(conf)
    assert (other.status, other.detail) == ("warn", "database 0 holds 3,000 keys, none of them c:*, s:*")
    redis_db.hset("c:7", "f", "v")
    half = keys_check(conf)
    assert (half.status, half.detail) == ("warn", "database 0: c:* found, no s:* yet")
    redis_db.hset("s:7", "f", "v")
    assert (keys_check(conf).status, keys_check(conf).detail) == ("ok", "database 0: c:*, s:* found (3,002 keys)")
    namespaced = keys_check(conf.model_copy(update={"redis": conf.redis.model_copy(update={"namespace": "prod"})}))
    assert namespaced.status == "warn" and "none of them prod:c:*, prod:s:*" in namespaced.detail
    redis_server.client(3).flushdb()

    # fm_reader may not SCAN (conf/base/redis-acl.txt): the key count is all it can tell
    server, password = acl_redis
    server.client().set("other", "x")
    (tmp_path / "pw").write_text(password)
    as_reader = ReaderSettings(redis={"username": "fm_reader", "password_file": str(tmp_path / "pw")})
    limited = keys_check(conf.model_copy(update={"redis": RedisSettings(url=server.url, password_env=None), "reader": as_reader}))
    assert (
        limited.status == "ok"
        and limited.detail == "database 0 holds 1 keys (whether c:*, s:* among them was not checked: this user may not SCAN)"
    )


def test_redis_without_persistence_is_a_warning(run_conf, redis_server, redis_db, acl_redis, tmp_path):
    def persistence(conf):
        return next(c for c in run_checks(conf, DEFS, SOURCES, ["redis"]) if c.name == "redis persistence")

    # the suite's servers run with --save "" --appendonly no
    conf = run_conf.model_copy(update={"redis": RedisSettings(url=redis_server.url, password_env=None)})
    none = persistence(conf)
    assert none.status == "warn" and none.detail == "no persistence (AOF off, no save points): a restart empties Redis until the next run"
    aof = start_redis(tmp_path / "aof", "--appendonly", "yes")
    rdb = start_redis(tmp_path / "rdb", "--save", "3600 1")
    try:
        at = lambda s: conf.model_copy(update={"redis": RedisSettings(url=s.url, password_env=None)})  # noqa: E731
        assert (persistence(at(aof)).status, persistence(at(aof)).detail) == ("ok", "AOF on: a restart keeps what was written")
        assert (persistence(at(rdb)).status, persistence(at(rdb)).detail) == (
            "ok",
            "AOF off, RDB snapshots on (save 3600 1): a restart keeps the last snapshot",
        )
    finally:
        aof.stop()
        rdb.stop()
    # fm_reader may not CONFIG GET: INFO persistence says what it can
    server, password = acl_redis
    (tmp_path / "pw").write_text(password)
    reader = ReaderSettings(redis={"username": "fm_reader", "password_file": str(tmp_path / "pw")})
    as_reader = conf.model_copy(update={"redis": RedisSettings(url=server.url, password_env=None), "reader": reader})
    limited = persistence(as_reader)
    assert limited.status == "warn" and "AOF off and no RDB snapshot in the" in limited.detail and "CONFIG GET refused" in limited.detail
    server.client().save()
    assert persistence(as_reader).status == "ok" and persistence(as_reader).detail.startswith(
        "AOF off; 1 RDB snapshot(s) since the server started"
    )


def test_an_unrestricted_default_user_is_named(run_conf, acl_redis, tmp_path):
    server, password = acl_redis
    assert server.client().execute_command("ACL", "SETUSER", "admin", "on", ">" + password, "~*", "&*", "+@all") == b"OK"
    admin = redis.Redis(host="127.0.0.1", port=server.port, username="admin", password=password)
    (tmp_path / "pw").write_text(password)
    writer = RedisSettings(url=server.url, username="fm_writer", password_file=str(tmp_path / "pw"))
    reader = ReaderSettings(redis={"username": "fm_reader", "password_file": str(tmp_path / "pw")})
    conf = run_conf.model_copy(update={"redis": writer, "reader": reader})

    def default_user():
        return next(c for c in run_checks(conf, DEFS, SOURCES, ["redis"]) if c.name == "redis default user")

    # the server's own default: nopass, every command (loopback: a warning; elsewhere it fails)
    open_user = default_user()
    assert open_user.status == "warn" and open_user.detail == (
        f"redis://127.0.0.1:{server.port}/0: the default user needs no password and may run writes and CONFIG SET: "
        "whoever reaches the port may change or flush every key"
    )
    assert admin.dbsize() == 0 and admin.config_get("__doctor_probe__") == {}
    admin.execute_command("ACL", "SETUSER", "default", "resetkeys", "-@all", "+ping", "+hello", "+auth")
    assert default_user().status == "ok" and "needs no password but may not write or change the config" in default_user().detail
    admin.execute_command("ACL", "SETUSER", "default", ">" + password, "resetpass", "on", ">" + password)
    closed = default_user()
    assert (closed.status, closed.detail) == (
        "ok",
        f"redis://127.0.0.1:{server.port}/0: a connection without a password may not run commands",
    )


def test_the_push_credentials_are_checked_and_push_off_holds_none(acl_redis, pg_server, pg_db, sql_roles, tmp_path, monkeypatch):
    from jobs.operations.doctor.push import push_steps

    server, password = acl_redis
    monkeypatch.setenv("FM_TEST_ACL_PASSWORD", password)
    folder = tmp_path / "defs"
    folder.mkdir()
    (folder / "entities.yaml").write_text((DEFS_DIR / "entities.yaml").read_text())
    (folder / "events.yaml").write_text(EVENTS.format(extra="  push_source: events_push\n"))
    defs = load_definitions(folder)
    owner = RunConf(env="t", sql=SqlSettings(dsn=sql_roles["fm_schema"], password_env="FM_TEST_FM_SCHEMA_PASSWORD"), sinks=["sql"])
    ensure_tables(owner, defs, ["events"])

    def push_checks(push: dict, **sections) -> dict[str, tuple[str, str]]:
        conf = RunConf(
            env="t",
            sinks=["redis", "sql"],
            redis=RedisSettings(url=server.url, username="fm_writer", password_env="FM_TEST_ACL_PASSWORD"),
            sql=SqlSettings(dsn=sql_roles["fm_writer"], password_env="FM_TEST_FM_WRITER_PASSWORD"),
            server={"push": push},
            **sections,
        )
        return {c.name: (c.status, c.detail) for _, step in push_steps(conf, defs, list(conf.sinks)) for c in step()}

    assert push_checks({"enabled": False}) == {"push": ("ok", "off (server.push.enabled: false): the server holds no writer credentials")}
    # on, as the run's writer: works, and a user of its own is advised
    found = push_checks({"enabled": True})
    assert found == {
        "push": ("ok", "on: 1 source(s) take /write-to-online-store; push sources events_push"),
        "push redis": ("warn", "server.push.redis is not set: pushes write as fm_writer, the run's writer"),
        "push sql": ("warn", "server.push.sql is not set: pushes write as fm_writer, the run's writer"),
    }
    # the reader's credentials for pushes: refused, naming what they may not do
    as_reader = {
        "enabled": True,
        "redis": {"username": "fm_reader", "password_env": "FM_TEST_ACL_PASSWORD"},
        "sql": {"user": "fm_reader", "password_env": "FM_TEST_FM_READER_PASSWORD"},
    }
    found = push_checks(as_reader)
    # fm_reader has no MULTI: the commands that would write (HSET, SCRIPT LOAD) are not tried, the others refused
    denied = "EVALSHA, HGET, HLEN, HGETALL, MEMORY USAGE, OBJECT ENCODING"
    assert found["push redis"] == ("fail", f"user fm_reader may not run {denied} on c:*: pushes fail")
    assert found["push sql consumer_features"] == ("fail", "role fm_reader lacks INSERT, UPDATE on consumer_features: pushes fail")
    # a writer of their own: ok
    as_writer = {
        "enabled": True,
        "redis": {"username": "fm_writer", "password_env": "FM_TEST_ACL_PASSWORD"},
        "sql": {"user": "fm_writer", "password_env": "FM_TEST_FM_WRITER_PASSWORD"},
    }
    found = push_checks(as_writer)
    assert found["push redis"] == ("ok", "user fm_writer connects and may run the writer's commands")
    assert found["push sql"] == ("ok", "role fm_writer connects and may SELECT, INSERT and UPDATE the tables pushes write")
    monkeypatch.delenv("FM_TEST_FM_WRITER_PASSWORD")
    assert push_checks(as_writer)["push sql"][0] == "fail"
    assert "server.push.sql.password_env names 'FM_TEST_FM_WRITER_PASSWORD'" in push_checks(as_writer)["push sql"][1]
    assert server.client().dbsize() == 0  # nothing written
