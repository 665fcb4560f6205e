"""``materialize doctor``: the server's pushes (``server.push``). Off, one line: the server
holds no writer credentials. On: the push credentials connect to each store the run writes,
and may run the writer's commands (Redis) or INSERT and UPDATE the tables of the sources that
take pushes (SQL); credentials of its own are advised (conf/README.md "Least privilege")."""

from __future__ import annotations

from dataclasses import replace

from feature_defs import Definitions
from fm_config import ConfigError, RunConf
from jobs.operations.doctor.line import DoctorLine
from sinks.redis.config import redis_sink_config
from sinks.sql.config import sql_sink_config

LEAST_PRIVILEGE = "conf/README.md 'Least privilege'"


def push_steps(conf: RunConf, defs: Definitions, sinks: list[str]) -> list:
    """(name, step) of the push checks, for doctor's run_checks."""
    if not conf.server.push.enabled:
        return [("push", lambda: [DoctorLine("ok", "push", "off (server.push.enabled: false): the server holds no writer credentials")])]
    steps = [("push", lambda: [_sources(defs), *_open(conf)])]
    if "redis" in sinks:
        steps.append(("push redis", lambda: check_push_redis(conf, defs)))
    if "sql" in sinks:
        steps.append(("push sql", lambda: check_push_sql(conf, defs)))
    return steps


def _open(conf: RunConf) -> list[DoctorLine]:
    """Pushes write the stores: off a loopback address, without bearer tokens anyone reaching the port may."""
    from feature_reader.auth import is_loopback

    if conf.server.auth.mode == "jwt" or is_loopback(conf.server.host):
        return []
    detail = f"pushes on {conf.server.host} without server.auth: anyone reaching the port may write features"
    return [DoctorLine("warn", "push auth", detail, "set server.auth (mode: jwt) with push grants")]


def _pushable(defs: Definitions) -> list:
    return [s for s in defs.sources.values() if s.by_event_time]


def _sources(defs: Definitions) -> DoctorLine:
    named = sorted({s.push_source for s in defs.sources.values() if s.push_source})
    pushable = _pushable(defs)
    if not pushable:
        return DoctorLine("warn", "push", "on, but no source is selected by event time: every push is refused", "select_by: event_time")
    names = f"push sources {', '.join(named)}" if named else "no push source (push_source: <name>): /push finds none"
    return DoctorLine("ok", "push", f"on: {len(pushable)} source(s) take /write-to-online-store; {names}")


def check_push_redis(conf: RunConf, defs: Definitions) -> list[DoctorLine]:
    import redis

    from jobs.operations.doctor.rights import writer_denied
    from stores.redis import connect

    try:
        connection = conf.push_redis_connection()
    except ConfigError as exc:
        return [
            DoctorLine("fail", "push redis", str(exc), "set the password's env var or file (server.push.redis, or redis: the writer's)")
        ]
    user = connection.username or "default"
    client = connect(redis_sink_config(conf, connection=connection), socket_timeout=5.0)
    checks = []
    try:
        client.ping()
        for name in sorted({s.entity for s in _pushable(defs)}):
            prefix = redis_sink_config(conf, entity=defs.entities[name], connection=connection).key_prefix
            denied, _ = writer_denied(client, (prefix + "__doctor_probe__").encode())
            if denied:
                checks.append(DoctorLine("fail", "push redis", f"user {user} may not run {', '.join(denied)} on {prefix}*: pushes fail",
                                         f"grant the fm_writer ACL (conf/base/redis-acl.txt, {LEAST_PRIVILEGE})"))  # fmt: skip
    except redis.RedisError as exc:
        text = str(exc).strip()
        return [DoctorLine("fail", "push redis", f"user {user}: cannot connect ({text})", "check server.push.redis and its password")]
    finally:
        client.close()
    if checks:
        return checks
    if conf.server.push.redis is None:
        return [DoctorLine("warn", "push redis", f"server.push.redis is not set: pushes write as {user}, the run's writer",
                           f"give pushes a writer user of their own, e.g. fm_pusher ({LEAST_PRIVILEGE})")]  # fmt: skip
    return [DoctorLine("ok", "push redis", f"user {user} connects and may run the writer's commands")]


def check_push_sql(conf: RunConf, defs: Definitions) -> list[DoctorLine]:
    import psycopg

    from jobs.operations.doctor.rights import sql_table_rights
    from stores.sql import connect

    try:
        connection = conf.push_sql_connection()
    except ConfigError as exc:
        return [DoctorLine("fail", "push sql", str(exc), "set the password's env var or file (server.push.sql, or sql: the writer's)")]
    base = sql_sink_config(conf, connection=connection)
    role = psycopg.conninfo.conninfo_to_dict(base.dsn).get("user", "?")
    try:
        conn = connect(base)
    except psycopg.Error as exc:
        text = str(exc).strip().splitlines()[0]
        return [DoctorLine("fail", "push sql", f"role {role}: cannot connect ({text})", "check server.push.sql and its password")]
    checks = []
    with conn:
        conn.execute("SET default_transaction_read_only = on")  # nothing this session does can write
        for table in sorted({defs.entities[s.entity].sql_table for s in _pushable(defs)}):
            config = replace(base, table=table)
            rights = sql_table_rights(conn, config.table, config.schema)
            if rights is None:
                checks.append(
                    DoctorLine("warn", f"push sql {table}", f"{config.table_name} is not there yet: pushes fail until a run makes it")
                )
                continue
            may_read, privileges, _ = rights
            lacking = ["SELECT"] * (not may_read) + [p for p in ("INSERT", "UPDATE") if p not in privileges]
            if lacking:
                text = f"role {role} lacks {', '.join(lacking)} on {config.table_name}: pushes fail"
                fix = f"grant the fm_writer role's privileges (conf/base/sql-grants.sql, {LEAST_PRIVILEGE})"
                checks.append(DoctorLine("fail", f"push sql {table}", text, fix))
    if checks:
        return checks
    if conf.server.push.sql is None:
        return [DoctorLine("warn", "push sql", f"server.push.sql is not set: pushes write as {role}, the run's writer",
                           f"give pushes a role of their own with the fm_writer grants ({LEAST_PRIVILEGE})")]  # fmt: skip
    return [DoctorLine("ok", "push sql", f"role {role} connects and may SELECT, INSERT and UPDATE the tables pushes write")]
