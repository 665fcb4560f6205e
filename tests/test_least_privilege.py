"""Least privilege: the job under a Redis ACL user and SQL roles holding only what it needs.

The ACL line and the grants are read from the files conf/README.md points to
(conf/base/redis-acl.txt, conf/base/sql-grants.sql), so what is documented is what is tested.
Results are read back raw as the admin user (Redis default user, PostgreSQL superuser).
"""

from __future__ import annotations

import asyncio
import json
import os
import pickle
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg.conninfo import conninfo_to_dict

from feature_reader import AsyncFeatureReader, FeatureReader
from fm_config import ConfigError, RunConf, load_config
from fm_config.reader import ReaderSettings
from fm_config.redis import RedisSettings
from fm_config.sql import SqlSettings
from jobs.operations.cleanup.redis import SourceCleanup, run_cleanup
from jobs.operations.schema import ensure_tables
from jobs.pipeline.run import run_source
from jobs.transforms import ENTITY_ID
from serializers import field_id
from serializers.resp import WRITE_SCRIPT_SHA
from sinks.errors import TerminalSinkError
from sinks.redis.capacity import read_memory_info
from throwaway.cluster import start_cluster

from .expected import entity_count, is_null
from .support.cli import BIN, run
from .support.confs import env_conf
from .support.consumer_job import (
    AS_OF_DAY2,
    CONSUMER,
    DAY2,
    DEFS,
    check_consumer_hashes,
    check_consumer_rows,
    expected_consumers,
    same_value,
)
from .support.privileges import ACL_FILE, acl_commands
from .support.serving import serve


def test_acl_keys_are_exactly_the_entity_prefixes():
    writer, reader = (line.split() for line in ACL_FILE.read_text().splitlines())
    # each prefix's entity keys and the hash that describes them (serializers/FORMAT.md "The stores' description")
    expected = {k for e in DEFS.entities.values() for k in (f"~{e.prefix}:*", f"~{e.prefix}")}
    assert {a for a in writer if "~" in a} == expected == {"~c:*", "~s:*", "~c", "~s"}
    # the reader's keys are read-only (%R): even a command granted by mistake could not write them
    assert {a for a in reader if "~" in a} == {f"%R{k}" for k in expected}


def test_job_verify_and_cleanup_run_as_the_acl_user(spark, sample_root, run_conf, acl_redis, tmp_path):
    server, password = acl_redis
    admin = server.client()
    # a mounted secret: the executors read it themselves (this session's executors started
    # before the test, so an env var set now would not reach them)
    (tmp_path / "redis_password").write_text(password + "\n")
    limited = RedisSettings(
        url=server.url, username="fm_writer", password_env=None, password_file=str(tmp_path / "redis_password"),
        pipeline_entities=64, sample_entities=50,
        hash_max_listpack_value=256,  # the server's setting, which this user may not read with CONFIG GET
    )  # fmt: skip
    conf = run_conf.model_copy(update={"redis": limited})
    assert conf.quality.verify_sample > 0  # the run reads a sample back (HGETALL) as this user too

    summary = run_source(spark, conf, DEFS, "consumer_daily", DAY2)
    expected = expected_consumers(spark, sample_root, DAY2)
    assert summary.status == "succeeded"
    assert entity_count(admin) == len(expected) == summary.entities
    assert summary.sinks["redis"]["values_set"] == check_consumer_hashes(admin, expected, DAY2)
    assert summary.verification["redis"]["checked"] > 0 and summary.verification["redis"]["mismatches"] == 0
    # The only command refused was CONFIG GET (tolerated, and said in the summary): the
    # capacity sampling (MEMORY USAGE, OBJECT ENCODING, HLEN, HMGET) and all writes were allowed.
    refused = {e["object"] for e in admin.acl_log() if e["username"] == "fm_writer"}
    assert refused - {"client|setinfo"} == {"config|get"}  # redis-py's CLIENT SETINFO is refused on Redis >= 7.2, and ignored
    assert any("CONFIG GET hash-max-listpack-* refused" in w and "value 256 (from the config)" in w for w in summary.warnings)
    encodings = {admin.object("encoding", f"c:{cid}") for cid in expected}
    assert encodings == {b"listpack"} and summary.sinks["redis"]["predicted_encoding"] == "listpack"

    # cleanup (INFO + HDEL) as the same user: a field of a dropped feature goes, nothing else
    stale = field_id("dropped_feature")
    ids = sorted(expected)[:40]
    for cid in ids:
        admin.hset(f"c:{cid}", stale, b"1")
    keys = spark.createDataFrame([(str(cid),) for cid in ids], f"{ENTITY_ID} string")
    plan = SourceCleanup("consumer_daily", fields=["dropped_feature"], steps=[])
    stats = run_cleanup(conf, DEFS.entities["consumer"], plan, keys)
    assert stats["fields_removed"] == len(ids) and stats["keys"] == len(ids)
    check_consumer_hashes(admin, expected, DAY2)  # exactly the source's fields again


def test_acl_user_is_really_restricted(acl_redis):
    server, password = acl_redis
    admin = server.client()
    admin.hset("c:1", "f", "v")
    user = redis.Redis(host="127.0.0.1", port=server.port, username="fm_writer", password=password)
    assert user.hset("c:2", "f", "v") == 1  # allowed: a key of an entity prefix
    refused = [("FLUSHALL",), ("CONFIG", "SET", "maxmemory", "1"), ("KEYS", "*"), ("SCAN", "0"), ("DEL", "c:1"),
               ("HSET", "x:1", "f", "v"), ("HGETALL", "other"), ("ACL", "SETUSER", "fm_writer", "+@all")]  # fmt: skip
    for command in refused:
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.execute_command(*command)
    assert sorted(admin.keys()) == [b"c:1", b"c:2"] and admin.hgetall("c:1") == {b"f": b"v"}
    with pytest.raises(redis.exceptions.AuthenticationError):
        redis.Redis(host="127.0.0.1", port=server.port, username="fm_writer", password="not-" + password).ping()
    # CONFIG GET is refused, so the capacity check uses the config's copy of the limits, or Redis's defaults
    plain = read_memory_info(user)
    assert (plain.listpack_entries, plain.listpack_value) == (512, 64) and "Redis's defaults" in plain.listpack_note
    assert read_memory_info(admin).listpack_value == 256 and read_memory_info(admin).listpack_note is None


def writer_conf(sql_conf, dsns, secrets_dir):
    sql_writer = SqlSettings(
        dsn=dsns["fm_writer"],
        password_env=None,
        password_file=str(secrets_dir / "fm_writer_password"),
        retry_base_delay=0.01,
        retry_max_delay=0.05,
    )
    return sql_conf.model_copy(update={"sql": sql_writer})


def test_schema_step_as_owner_then_job_as_writer(spark, sample_root, sql_conf, pg_db, sql_roles, tmp_path):
    conf_dir = env_conf(tmp_path / "conf", "lp", f"sql:\n  dsn: {sql_roles['fm_writer']}\n  password_env: FM_TEST_FM_WRITER_PASSWORD\n")
    out = run(
        str(BIN / "materialize"), "schema", "--env", "lp", "--sql-dsn", sql_roles["fm_schema"],
        "--sql-password-env", "FM_TEST_FM_SCHEMA_PASSWORD",
        env={"FM_CONF_DIR": str(conf_dir)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "consumer_features: created" in out.stdout and "store_features: created" in out.stdout
    owners = dict(pg_db.execute("SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'").fetchall())
    assert owners == {"consumer_features": "fm_schema", "store_features": "fm_schema", "stored_names": "fm_schema"}

    conf = writer_conf(sql_conf, sql_roles, tmp_path)
    assert ensure_tables(conf, DEFS, list(DEFS.sources)) == {"consumer_features": "exists", "store_features": "exists"}
    summary = run_source(spark, conf, DEFS, "consumer_daily", DAY2)
    expected = expected_consumers(spark, sample_root, DAY2)
    assert summary.status == "succeeded" and summary.sinks["sql"]["rows_upserted"] == len(expected)
    assert check_consumer_rows(pg_db, expected, AS_OF_DAY2) > 20 * len(expected)
    assert summary.verification["sql"]["checked"] > 0 and summary.verification["sql"]["mismatches"] == 0

    with psycopg.connect(sql_roles["fm_writer"], password=conf.sql_password().get_secret_value(), autocommit=True) as writer:
        for statement in ("DROP TABLE consumer_features", "ALTER TABLE consumer_features ADD COLUMN extra int",
                          "CREATE TABLE extra (a int)", "DELETE FROM consumer_features", "TRUNCATE consumer_features"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                writer.execute(statement)
    assert pg_db.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == len(expected)
    assert {r[0] for r in pg_db.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")} == set(owners)


def test_writer_without_the_table_is_told_to_run_the_schema_step(spark, sql_conf, pg_db, redis_db, sql_roles, tmp_path):
    conf = writer_conf(sql_conf, sql_roles, tmp_path).model_copy(update={"sinks": ["redis", "sql"]})
    with pytest.raises(
        TerminalSinkError, match=r"store_features does not exist .*may not create it .*42501.*`materialize schema --env <env>`"
    ):
        run_source(spark, conf, DEFS, "store_features_long", DAY2)
    assert pg_db.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone()[0] == 0
    assert redis_db.dbsize() == 0  # found before either store was written
    # a table the writer may only read is refused the same way, before any write
    owner = SqlSettings(dsn=sql_roles["fm_schema"], password_env="FM_TEST_FM_SCHEMA_PASSWORD")
    assert ensure_tables(sql_conf.model_copy(update={"sql": owner}), DEFS, ["store_features_long"]) == {"store_features": "created"}
    pg_db.execute("REVOKE INSERT, UPDATE ON store_features FROM fm_writer")
    with pytest.raises(TerminalSinkError, match=r"store_features: this role lacks INSERT, UPDATE on it"):
        run_source(spark, conf, DEFS, "store_features_long", DAY2)
    assert redis_db.dbsize() == 0 and pg_db.execute("SELECT count(*) FROM store_features").fetchone()[0] == 0
    (tmp_path / "fm_writer_password").unlink()  # the password comes from that file, and only from there
    with pytest.raises(ConfigError, match="fm_writer_password"):
        ensure_tables(conf, DEFS, ["store_features_long"])


# -- the read side: fm_reader in Redis and in the SQL store ---------------------------------

READ_FEATURES = [f"consumer_daily:{name}" for name in ("orders_7d", "churn_score", "favorite_cuisine", "taste_embedding")]


def reader_settings(redis_url: str, dsn: str, password_file: Path) -> dict:
    """A conf whose store sections hold the admin's credentials and whose reader sections
    hold fm_reader's: whatever reads with the admin's would be the store sections' fault."""
    return {
        "sinks": ["redis", "sql"],
        "redis": {"url": redis_url, "password_env": None},  # mode auto: the reader asks INFO cluster
        "sql": {"dsn": dsn, "password_env": None},
        "reader": {
            "timeout_ms": 5000,
            "cache": {"enabled": False},
            "redis": {"username": "fm_reader", "password_file": str(password_file)},
            "sql": {"user": "fm_reader", "password_env": "FM_TEST_FM_READER_PASSWORD"},
        },
    }


def check_read_values(expected: dict[int, dict], ids: list[int], columns: dict[str, tuple[list, list]]) -> int:
    """columns: feature -> (values, statuses) for ``ids`` then one consumer never written."""
    checked = 0
    for ref in READ_FEATURES:
        feature = CONSUMER.feature(ref.split(":")[1])
        values, statuses = columns[feature.name]
        assert statuses[-1] == "NOT_FOUND" and values[-1] is None, ref
        for cid, value, status in zip(ids, values, statuses):
            source = expected[cid][feature.name]
            if is_null(source):
                assert (value, status) == (None, "NULL_VALUE"), (ref, cid)
            else:
                assert status == "PRESENT" and same_value(feature, value, source), (ref, cid, value, source)
                checked += 1
    return checked


def test_reader_and_server_read_as_fm_reader_who_may_not_write(spark, sample_root, run_conf, acl_redis, pg_server, sql_roles, tmp_path):
    server, password = acl_redis
    admin = server.client()
    # the tables made by the schema step's role (fm_reader's SELECT comes from its default privileges), written by the job
    owner = SqlSettings(dsn=sql_roles["fm_schema"], password_env="FM_TEST_FM_SCHEMA_PASSWORD")
    assert ensure_tables(run_conf.model_copy(update={"sql": owner}), DEFS, ["consumer_daily"]) == {"consumer_features": "created"}
    store = SqlSettings(dsn=pg_server.dsn, password_env=None)
    conf = run_conf.model_copy(update={"redis": RedisSettings(url=server.url, password_env=None, sample_entities=50), "sql": store,
                                       "sinks": ["redis", "sql"]})  # fmt: skip
    assert run_source(spark, conf, DEFS, "consumer_daily", DAY2).status == "succeeded"
    expected = expected_consumers(spark, sample_root, DAY2)
    ids = sorted(expected)[:25]
    entities = {"consumer_id": [*ids, 10**9]}
    keys_before = {k: admin.hgetall(k) for k in admin.keys()}
    (tmp_path / "fm_reader_password").write_text(password + "\n")
    settings = reader_settings(server.url, pg_server.dsn, tmp_path / "fm_reader_password")
    read_conf = conf.model_copy(update={"reader": RunConf.model_validate(settings).reader})
    admin.acl_log_reset()

    # the library, both kinds, both stores
    with FeatureReader(read_conf, DEFS, cache=False) as reader:
        assert reader.ping() == {"redis": "ok", "sql": "ok"}
        for store_name in ("redis", "sql"):
            result = reader.get_online_features(READ_FEATURES, entities, store=store_name)
            columns = {c.name: (c.values, c.statuses) for c in result.columns}
            assert check_read_values(expected, ids, columns) > 50, store_name
        users = {c["user"] for c in admin.client_list()} - {"default"}  # the admin's, and the job's
        with pg_server.connect() as pg:
            sessions = {r[0] for r in pg.execute("SELECT usename FROM pg_stat_activity WHERE datname = current_database()")}
    assert users == {"fm_reader"} and "fm_reader" in sessions

    async def read_async():
        async with AsyncFeatureReader(read_conf, DEFS, cache=False) as reader:
            assert await reader.ping() == {"redis": "ok", "sql": "ok"}
            return [await reader.get_online_features(READ_FEATURES, entities, store=s) for s in ("redis", "sql")]

    for result in asyncio.run(read_async()):
        assert check_read_values(expected, ids, {c.name: (c.values, c.statuses) for c in result.columns}) > 50

    # `materialize serve`, in a process of its own, on that conf: one reading Redis, one the SQL store
    # it needs only the reader's passwords: the writer's, named but not set, are never read
    unset = {"redis": {**settings["redis"], "password_env": "FM_TEST_UNSET_WRITER_PASSWORD"},
             "sql": {**settings["sql"], "password_env": "FM_TEST_UNSET_WRITER_PASSWORD"}}  # fmt: skip
    assert "FM_TEST_UNSET_WRITER_PASSWORD" not in os.environ
    for store_name in ("redis", "sql"):
        only = {**settings, **unset, "reader": {**settings["reader"], "stores": {"consumer_daily": [store_name]}}}
        served = serve(tmp_path, f"lp{store_name}", only)
        try:
            status, body = served.post({"features": READ_FEATURES, "entities": entities})
            assert status == 200, body
            results = json.loads(body)["results"]
            columns = {ref.split(":")[1]: (r["values"], r["statuses"]) for ref, r in zip(READ_FEATURES, results[1:])}
            assert check_read_values(expected, ids, columns) > 50, store_name
            assert served.request("GET", "/health")[0] == 200
        finally:
            served.stop()

    refused = [(e["username"], e["object"]) for e in admin.acl_log()]
    # redis-py's CLIENT SETINFO (Redis >= 7.2) is refused and ignored, as for the writer
    assert [r for r in refused if r[1] != "client|setinfo"] == [], refused

    # nothing that writes goes through: Redis refuses it before running it
    user = redis.Redis(host="127.0.0.1", port=server.port, username="fm_reader", password=password)
    key = f"c:{ids[0]}"
    for command in [("HSET", key, "f", "v"), ("HDEL", key, field_id("orders_7d")), ("DEL", key), ("EXPIRE", key, "1"),
                    ("EVALSHA", WRITE_SCRIPT_SHA, "1", key, "0"), ("EVAL", "return 1", "0"), ("SCRIPT", "LOAD", "return 1"),
                    ("SET", "c:new", "v"), ("UNLINK", key), ("FLUSHALL",), ("CONFIG", "SET", "maxmemory", "1"), ("SCAN", "0"),
                    ("KEYS", "*"), ("HGETALL", key), ("HMGET", "x:1", "f"), ("MULTI",)]:  # fmt: skip
        with pytest.raises(redis.exceptions.NoPermissionError):
            user.execute_command(*command)
    assert {k: admin.hgetall(k) for k in admin.keys()} == keys_before
    with psycopg.connect(sql_roles["fm_reader"], password=os.environ["FM_TEST_FM_READER_PASSWORD"], autocommit=True) as reader_sql:
        assert reader_sql.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == len(expected)
        for statement in ("INSERT INTO consumer_features (entity_key, source, features, as_of) VALUES ('x', 'y', '{}', now())",
                          "UPDATE consumer_features SET features = '{}'", "DELETE FROM consumer_features", "TRUNCATE consumer_features",
                          "DROP TABLE consumer_features", "ALTER TABLE consumer_features ADD COLUMN extra int",
                          "CREATE TABLE extra (a int)"):  # fmt: skip
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                reader_sql.execute(statement)
    with pg_server.connect() as pg:
        assert pg.execute("SELECT count(*) FROM consumer_features").fetchone()[0] == len(expected)
        assert {r[0] for r in pg.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")} == {
            "consumer_features",
            "stored_names",
        }


def test_cluster_reads_as_fm_reader_follow_ask_and_moved_with_no_refused_command(spark, sample_root, run_conf, tmp_path, monkeypatch):
    cluster = start_cluster(tmp_path / "cluster", 3, 0, "--maxmemory", "64mb")
    try:
        for port in cluster.primaries():
            for command in acl_commands("pw-" + str(cluster.ports[0])):
                assert cluster.client(port).execute_command(*command) == b"OK"
        conf = run_conf.model_copy(update={"redis": RedisSettings(url=cluster.url, password_env=None, sample_entities=50)})
        assert run_source(spark, conf, DEFS, "consumer_daily", DAY2).status == "succeeded"  # written as the default user
        expected = expected_consumers(spark, sample_root, DAY2)
        ids = sorted(expected)[:25]
        entities = {"consumer_id": [*ids, 10**9]}
        monkeypatch.setenv("FM_TEST_CLUSTER_READER_PASSWORD", "pw-" + str(cluster.ports[0]))
        reader = ReaderSettings(timeout_ms=5000, redis={"username": "fm_reader", "password_env": "FM_TEST_CLUSTER_READER_PASSWORD"})
        read_conf = conf.model_copy(update={"reader": reader})  # redis.mode auto: INFO, then the cluster client's discovery

        def read_both(phase: str) -> None:
            async def read_async():
                async with AsyncFeatureReader(read_conf, DEFS, cache=False) as async_reader:
                    return await async_reader.get_online_features(READ_FEATURES, entities)

            with FeatureReader(read_conf, DEFS, cache=False) as sync_reader:
                results = [sync_reader.get_online_features(READ_FEATURES, entities), asyncio.run(read_async())]
            for result in results:
                assert check_read_values(expected, ids, {c.name: (c.values, c.statuses) for c in result.columns}) > 50, phase

        read_both("stable")
        # one key's slot migrating (ASK), then migrated (MOVED): the redirects a reader follows
        key = f"c:{ids[0]}".encode()
        first = cluster.client(cluster.ports[0])
        slot = first.cluster("keyslot", key)
        source_port = next(p for p in cluster.primaries() if cluster.client(p).exists(key))
        target_port = next(p for p in cluster.primaries() if p != source_port)
        source, target = cluster.client(source_port), cluster.client(target_port)
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source.cluster("myid"))
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target.cluster("myid"))
        for batch in iter(lambda: source.cluster("getkeysinslot", slot, 100), []):
            source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000, "KEYS", *batch)
        source.config_resetstat()
        read_both("migrating")
        assert int(source.info("errorstats").get("errorstat_ASK", {}).get("count", 0)) >= 1
        for port in cluster.primaries():
            cluster.client(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", target.cluster("myid"))
        cluster.wait_ok()
        read_both("migrated")

        refused = {port: [(e["username"], e["object"]) for e in cluster.client(port).acl_log()] for port in cluster.primaries()}
        assert all(r[1] == "client|setinfo" for entries in refused.values() for r in entries), refused
        user = redis.Redis(host="127.0.0.1", port=target_port, username="fm_reader", password=os.environ["FM_TEST_CLUSTER_READER_PASSWORD"])
        for command in [("HSET", key, "f", "v"), ("HDEL", key, field_id("orders_7d")), ("DEL", key), ("READONLY",),
                        ("CLUSTER", "SETSLOT", slot, "STABLE"), ("CLUSTER", "FAILOVER"),
                        ("MIGRATE", "127.0.0.1", source_port, "", 0, 5000, "KEYS", key)]:  # fmt: skip
            with pytest.raises(redis.exceptions.NoPermissionError):
                user.execute_command(*command)
    finally:
        cluster.stop()


def test_reader_credentials_load_like_the_stores_and_never_hold_the_password(tmp_path, monkeypatch):
    folder = env_conf(tmp_path / "conf", "prod", "")
    monkeypatch.setenv("FM_CONF_DIR", str(folder))
    (folder / "base" / "m.yaml").write_text(
        "redis: {password_env: FM_TEST_UNSET_WRITER}\nsql: {dsn: 'postgresql://fm_writer@db:26257/features?sslmode=verify-full'}\n"
        "reader:\n  redis: {username: fm_reader, password_env: FM_TEST_READER_PW}\n"
        "  sql: {user: fm_reader, password_env: FM_TEST_READER_PW}\n"
    )
    (tmp_path / "pw").write_text("from-the-file\n")
    # a higher layer naming a file replaces the env var a lower one named, as for redis: and sql:
    (folder / "prod" / "m.yaml").write_text(f"reader:\n  redis: {{password_file: {tmp_path / 'pw'}}}\n")
    conf = load_config("prod")
    redis_conn = conf.reader_redis_connection()  # the writer's FM_TEST_UNSET_WRITER is never read
    assert (redis_conn.username, redis_conn.auth_password(), redis_conn.url) == ("fm_reader", "from-the-file", conf.redis.url)
    assert "from-the-file" not in repr(redis_conn) and b"from-the-file" not in pickle.dumps(redis_conn)
    with pytest.raises(ConfigError, match="reader.sql.password_env names 'FM_TEST_READER_PW', but that environment variable is not set"):
        conf.reader_sql_connection()
    monkeypatch.setenv("FM_TEST_READER_PW", "sql-secret")
    sql_conn = conf.reader_sql_connection()
    want = {"user": "fm_reader", "host": "db", "port": "26257", "dbname": "features", "sslmode": "verify-full"}
    assert conninfo_to_dict(sql_conn.dsn) == want
    assert sql_conn.auth_password() == "sql-secret" and "sql-secret" not in repr(sql_conn)
    # unset: the store sections' credentials, as before
    (folder / "base" / "m.yaml").write_text("redis: {username: fm_writer, password_env: FM_TEST_READER_PW}\n")
    (folder / "prod" / "m.yaml").write_text("")
    conf = load_config("prod")
    assert conf.reader_redis_connection() == conf.redis_connection() and conf.reader_sql_connection() == conf.sql_connection()
    (folder / "prod" / "m.yaml").write_text("reader:\n  redis: {username: fm_reader, password: literal}\n")
    with pytest.raises(ConfigError, match=r"m.yaml:2.*secrets are never read from config files"):
        load_config("prod")
