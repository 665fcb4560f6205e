"""``materialize doctor``, the read side: what the reader library and ``materialize serve``
connect with, and what a Redis they read from holds and risks.

Nothing is written, and no check needs an admin user:

- The reader's Redis user: ``HMGET`` and ``PING`` of a key that cannot exist (a random name
  under each entity's prefix); then every ``@write`` and ``@dangerous`` command, judged by
  ``ACL DRYRUN`` where some user here may run it, else run where Redis refuses it before it
  runs (rights.py).
- The reader's SQL role, in a read-only session: superuser, membership in the roles that
  write files or run programs, and per table every privilege beyond ``SELECT`` and
  ownership (rights.py).
- ``rediss://`` at a plain port, or ``redis://`` at a TLS one, is found by sending ``PING``
  in plain text on a socket of its own: a plain Redis answers RESP, a TLS one closes it.
- Whether the database holds the project's keys: ``SCAN MATCH <prefix>*`` (bounded) when
  the user may, else ``INFO keyspace`` (conf/base/redis-acl.txt grants no SCAN).
- Persistence: ``CONFIG GET`` when the user may, else ``INFO persistence``.
- The default user: a connection without credentials, then HSET with an odd argument count and
  ``CONFIG SET`` of a parameter that does not exist.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from collections.abc import Callable
from dataclasses import replace
from urllib.parse import urlsplit

from feature_defs import Definitions
from fm_config import RunConf
from jobs.operations.doctor.line import DoctorLine, Status
from jobs.operations.doctor.rights import FILE_ROLES, RedisRights, redis_rights, sql_role_powers, sql_table_rights

LEAST_PRIVILEGE = "conf/README.md 'Least privilege'"
SCAN_BATCHES = 10
SCAN_COUNT = 1000
"""At most SCAN_BATCHES x SCAN_COUNT keys are visited looking for the project's."""


def read_side_steps(
    conf: RunConf, defs: Definitions, sources: list[str], sinks: list[str]
) -> list[tuple[str, Callable[[], list[DoctorLine]]]]:
    """(name, step) of the read side's checks, for doctor's run_checks (the redis transport
    check runs before the writer's, with it)."""
    steps: list[tuple[str, Callable[[], list[DoctorLine]]]] = []
    if "redis" in sinks:
        steps.append(("reader redis", lambda: redis_read_checks(conf, defs, sources)))
    if "sql" in sinks:
        steps.append(("reader sql", lambda: check_reader_sql(conf, defs, sources)))
    return steps


def redis_read_checks(conf: RunConf, defs: Definitions, sources: list[str]) -> list[DoctorLine]:
    """The reader's user, then what the database holds and risks; nothing more once the
    transport is wrong (the redis transport check said so) or the reader cannot connect."""
    if _transport(conf)[1] != "ok":
        return []
    checks, connected = check_reader_redis(conf, defs, sources)
    if not connected:
        return checks
    for name, check in (
        ("redis keys", lambda: check_redis_keys(conf, defs, sources)),
        ("redis persistence", lambda: check_redis_persistence(conf)),
        ("redis default user", lambda: check_default_user(conf)),
    ):
        try:
            checks.append(check())
        except Exception as exc:  # noqa: BLE001 (one check that could not finish does not hide the others)
            checks.append(DoctorLine("fail", name, f"could not check: {type(exc).__name__}: {str(exc).strip() or 'no message'}"))
    return checks


# -- Redis: the port speaks what the URL says ---------------------------------------------


def check_redis_transport(conf: RunConf) -> list[DoctorLine]:
    """redis.url's scheme against what its port speaks (nothing when nothing answers there:
    the redis check says so)."""
    where, state = _transport(conf)
    if state == "unreachable" or not conf.redis.url.startswith(("redis://", "rediss://")):
        return []
    if state == "mismatch-plain":
        return [
            DoctorLine(
                "fail",
                "redis transport",
                f"redis.url is rediss:// but {where} answers plain Redis: no TLS on that port",
                "use redis:// for that port, or the port the server takes TLS on (its tls-port)",
            )
        ]
    if state == "mismatch-tls":
        return [
            DoctorLine(
                "fail",
                "redis transport",
                f"redis.url is redis:// but {where} speaks TLS only (it dropped a plain PING)",
                "use rediss:// (and redis.tls_ca_file for a private CA)",
            )
        ]
    if state == "unknown":
        return [
            DoctorLine("warn", "redis transport", f"{where}: answered a plain PING with neither Redis nor TLS, or not in 3 s: is it Redis?")
        ]
    speaks = "TLS" if conf.redis.url.startswith("rediss") else "plain Redis"
    return [DoctorLine("ok", "redis transport", f"{where}: {speaks}, as redis.url says")]


def _transport(conf: RunConf) -> tuple[str, str]:
    """(host:port, state): ok, mismatch-plain (rediss:// at a plain port), mismatch-tls, unknown or unreachable."""
    parts = urlsplit(conf.redis.url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    if parts.scheme not in ("redis", "rediss"):  # unix://: no TLS to get wrong
        return conf.redis.url, "ok"
    try:
        speaks = _port_speaks(host, port)
    except OSError:
        return f"{host}:{port}", "unreachable"
    tls_url = parts.scheme == "rediss"
    if speaks == "unknown":
        return f"{host}:{port}", "unknown"
    if speaks == "plain" and tls_url:
        return f"{host}:{port}", "mismatch-plain"
    if speaks == "tls" and not tls_url:
        return f"{host}:{port}", "mismatch-tls"
    return f"{host}:{port}", "ok"


def _port_speaks(host: str, port: int) -> str:
    """'plain' (answers RESP), 'tls' (drops plain text, or answers with a TLS alert) or 'unknown'."""
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.settimeout(3)
        try:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
        except (ConnectionResetError, BrokenPipeError):
            return "tls"
        except TimeoutError:
            return "unknown"
    if reply[:1] in (b"+", b"-"):  # +PONG, -NOAUTH, -DENIED, -ERR max clients: all plain RESP
        return "plain"
    if not reply or reply[:1] == b"\x15":  # closed, or a TLS alert record
        return "tls"
    return "unknown"


# -- Redis: the reader's user can read and cannot write ----------------------------------------


def probe(client, *args) -> bool:
    """Whether this user may run ``args`` (False: refused with NOPERM before it ran)."""
    import redis

    try:
        client.execute_command(*args)
    except redis.exceptions.NoPermissionError:
        return False
    except redis.ResponseError:
        pass  # wrong arguments, NOSCRIPT, MOVED: past the ACL check
    return True


def _probe_key(conf: RunConf, prefix: str) -> bytes:
    from serializers.keys import key_prefix

    return (key_prefix(prefix, conf.redis.namespace) + "__doctor_probe__" + secrets.token_hex(8)).encode()


def check_reader_redis(conf: RunConf, defs: Definitions, sources: list[str]) -> tuple[list[DoctorLine], bool]:
    """(checks, whether the reader's user could connect)."""
    import redis

    from serializers.keys import key_prefix
    from stores.redis import connect, server_address

    rconf = conf.reader_redis_connection()  # a missing password fails here, naming where it was looked for
    user = rconf.username or "default"
    client = connect(rconf, socket_timeout=5.0)
    try:
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            section = "reader.redis" if conf.reader.redis else "redis"
            return [
                DoctorLine(
                    "fail",
                    "reader redis",
                    f"{server_address(rconf.url)}: user {user}: authentication refused ({exc})",
                    f"check {section}.username and the password in {section}.password_env/_file",
                )
            ], False
        except redis.ConnectionError as exc:
            where = server_address(rconf.url)
            return [DoctorLine("fail", "reader redis", f"{where}: cannot connect ({exc})", "start Redis or fix redis.url")], False
        except redis.exceptions.NoPermissionError:
            pass  # PING refused: the reader's health check would fail, said below
        prefixes = sorted({defs.entity_of(defs.source(s)).prefix for s in sources})
        keys = [_probe_key(conf, prefix) for prefix in prefixes]
        unreadable = [key_prefix(p, conf.redis.namespace) + "*" for p, key in zip(prefixes, keys) if not probe(client, "HMGET", key, b"f")]
        other = [] if probe(client, "PING") else ["PING (the server's /health)"]
        rights = redis_rights(client, user, _judges(conf, rconf), keys[0])
    finally:
        client.close()
    checks = []
    if unreadable or other:
        what = [f"HMGET on {', '.join(unreadable)}"] if unreadable else []
        checks.append(
            DoctorLine(
                "fail",
                "reader redis",
                f"user {user} may not run {', '.join(what + other)}: reads fail",
                f"grant the fm_reader ACL (conf/base/redis-acl.txt, {LEAST_PRIVILEGE})",
            )
        )
    pattern = " and ".join(key_prefix(p, conf.redis.namespace) + "*" for p in prefixes)
    return checks + _reader_redis_rights(conf, user, pattern, rights, not checks), True


def _judges(conf: RunConf, rconf) -> list[Callable]:
    """Other connections that may run ACL DRYRUN for the reader's user: the writer's user
    (when the reader has its own), the default user without a password."""
    from stores.redis import connect

    writer = [lambda: connect(conf.redis_connection(), socket_timeout=5.0)] if conf.reader.redis else []
    return [*writer, lambda: connect(replace(rconf, username=None, password=None, secret=None), socket_timeout=5.0)]


def _few(names: list[str], shown: int = 10) -> str:
    return ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")


def _reader_redis_rights(conf: RunConf, user: str, pattern: str, rights: RedisRights | None, reads: bool) -> list[DoctorLine]:
    """What the reader's user may change: @write and @dangerous commands (rights.py)."""
    fix = f"give it the fm_reader ACL (conf/base/redis-acl.txt, {LEAST_PRIVILEGE})"
    if rights is None:
        return [DoctorLine("warn", "reader redis", f"user {user}: whether it may write was not judged: no user here may list the commands "
                           "(COMMAND)", "grant +command as fm_reader's ACL does (conf/base/redis-acl.txt)")]  # fmt: skip
    writes = [c for c in rights.allowed if c in rights.writes]
    dangerous = [c for c in rights.allowed if c not in rights.writes]
    said = " and ".join([f"write with {_few(writes)}"] * bool(writes) + [f"run @dangerous {_few(dangerous)}"] * bool(dangerous))
    if conf.reader.redis is None:
        create = f"create the fm_reader user (conf/base/redis-acl.txt) and set reader.redis ({LEAST_PRIVILEGE})"
        detail = f"reader.redis is not set: reads run as {user}, the writer's user" + (f", which may also {said}" if said else "")
        return [DoctorLine("warn", "reader redis", detail, create)]
    if said:
        return [DoctorLine("fail", "reader redis", f"reader.redis user {user} may {said}: reads need none of that ({rights.how})", fix)]
    untried = [c for c in rights.untried if c in rights.writes]
    if untried:
        detail = f"user {user}: {len(untried)} @write commands ({_few(untried, 5)}) could not be judged: {rights.why_untried}"
        return [DoctorLine("warn", "reader redis", detail, fix)]
    tried = rights.commands - len(rights.untried)
    detail = f"may run none of the {tried} @write and @dangerous commands ({rights.how})"
    if rights.untried:
        why = rights.why_untried if rights.dryrun else "only ACL DRYRUN judges them without running them, and no user here may run it"
        detail += f"; {len(rights.untried)} commands without keys ({_few(rights.untried, 3)}) were not tried: {why}"
    return [DoctorLine("ok", "reader redis", f"user {user} may read {pattern} and {detail}")] if reads else []


# -- Redis: the database holds the project's keys, persistence, the default user ------------


def check_redis_keys(conf: RunConf, defs: Definitions, sources: list[str]) -> DoctorLine:
    import redis

    from serializers.keys import key_prefix
    from stores.redis import connect

    rconf = conf.reader_redis_connection()
    db = int((urlsplit(rconf.url).path or "/0").strip("/") or 0)
    prefixes = sorted({key_prefix(defs.entity_of(defs.source(s)).prefix, conf.redis.namespace) for s in sources})
    named = ", ".join(p + "*" for p in prefixes)
    fix = "check the database number in redis.url and redis.namespace against what the runs wrote"
    client = connect(rconf, socket_timeout=5.0)
    try:
        keyspace = client.info("keyspace")
        held = {int(name[2:]): int(stats["keys"]) for name, stats in keyspace.items() if name.startswith("db")}
        found, complete, scanned = set(), True, True
        try:
            for prefix in prefixes:
                cursor, batches = None, 0
                while cursor != 0 and prefix not in found:
                    if batches == SCAN_BATCHES:
                        complete = False
                        break
                    cursor, keys = client.scan(cursor or 0, match=prefix + "*", count=SCAN_COUNT)
                    batches += 1
                    if keys:
                        found.add(prefix)
        except redis.exceptions.NoPermissionError:
            scanned = False
    finally:
        client.close()
    others = ", ".join(f"db {n} {k:,}" for n, k in sorted(held.items()) if n != db)
    if not held.get(db):
        return DoctorLine(
            "warn",
            "redis keys",
            f"database {db} is empty: no run has written it yet, or reads look in the wrong place"
            + (f" (keys are in: {others})" if others else ""),
            "run the nightly job (materialize run), or " + fix,
        )
    if not scanned:
        return DoctorLine(
            "ok",
            "redis keys",
            f"database {db} holds {held[db]:,} keys (whether {named} among them was not checked: this user may not SCAN)",
        )
    if not found:
        return DoctorLine(
            "warn",
            "redis keys",
            f"database {db} holds {held[db]:,} keys, none of them {named}"
            + ("" if complete else f" among the first {SCAN_BATCHES * SCAN_COUNT:,} visited"),
            fix,
        )
    missing = [p + "*" for p in prefixes if p not in found]
    if missing:
        seen = ", ".join(sorted(p + "*" for p in found))
        return DoctorLine("warn", "redis keys", f"database {db}: {seen} found, no {', '.join(missing)} yet", fix)
    return DoctorLine("ok", "redis keys", f"database {db}: {named} found ({held[db]:,} keys)")


def check_redis_persistence(conf: RunConf) -> DoctorLine:
    """A Redis without persistence comes back empty after a restart: every read is NOT_FOUND
    (or falls to SQL) until the next run rewrites it."""
    import redis

    from stores.redis import connect

    client = connect(conf.reader_redis_connection(), socket_timeout=5.0)
    fix = "set appendonly yes (or save points) on the server, or plan a re-run after each restart (materialize run)"
    try:
        try:
            config = client.config_get("appendonly") | client.config_get("save")
        except redis.exceptions.NoPermissionError:
            config = None
        info = client.info("persistence")
        uptime = int(client.info("server").get("uptime_in_seconds", 0))
    finally:
        client.close()
    if info.get("aof_enabled") or (config and config.get("appendonly") == "yes"):
        return DoctorLine("ok", "redis persistence", "AOF on: a restart keeps what was written")
    if config is not None:
        if config.get("save"):
            return DoctorLine(
                "ok", "redis persistence", f"AOF off, RDB snapshots on (save {config['save']}): a restart keeps the last snapshot"
            )
        return DoctorLine(
            "warn", "redis persistence", "no persistence (AOF off, no save points): a restart empties Redis until the next run", fix
        )
    saves = int(info.get("rdb_saves", 0))
    if saves:
        return DoctorLine("ok", "redis persistence", f"AOF off; {saves} RDB snapshot(s) since the server started (CONFIG GET refused)")
    return DoctorLine(
        "warn",
        "redis persistence",
        f"AOF off and no RDB snapshot in the {uptime:,} s since the server started (its save points could not be read: "
        "CONFIG GET refused to this user): a restart may empty Redis until the next run",
        fix,
    )


def check_default_user(conf: RunConf) -> DoctorLine:
    """Whether anyone who reaches the port may do anything: a connection without
    credentials, then the no-op probes (a write, CONFIG SET) as that default user."""
    import redis

    from stores.redis import connect, server_address

    rconf = conf.reader_redis_connection()
    where = server_address(rconf.url)
    anonymous = replace(rconf, username=None, password=None, secret=None)
    client = connect(anonymous, socket_timeout=5.0)
    try:
        try:
            client.ping()
        except (redis.AuthenticationError, redis.ResponseError):  # NOAUTH, DENIED (protected mode), NOPERM
            return DoctorLine("ok", "redis default user", f"{where}: a connection without a password may not run commands")
        allowed = [
            name
            for name, args in (
                ("writes", ("HSET", b"__doctor_probe__" + secrets.token_hex(8).encode(), b"f", b"v", b"odd-argument-count")),
                ("CONFIG SET", ("CONFIG", "SET", "__doctor_probe__", "x")),
            )
            if probe(client, *args)
        ]
    finally:
        client.close()
    if not allowed:
        return DoctorLine("ok", "redis default user", f"{where}: the default user needs no password but may not write or change the config")
    status: Status = "warn" if _loopback(urlsplit(rconf.url).hostname or "") else "fail"
    return DoctorLine(
        status,
        "redis default user",
        f"{where}: the default user needs no password and may run {' and '.join(allowed)}: "
        "whoever reaches the port may change or flush every key",
        "give it a password or turn it off (ACL SETUSER default off) and connect as the users of "
        f"conf/base/redis-acl.txt ({LEAST_PRIVILEGE})",
    )


def _loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- SQL: the reader's role can read and cannot write -------------------------------------


def check_reader_sql(conf: RunConf, defs: Definitions, sources: list[str]) -> list[DoctorLine]:
    from psycopg.conninfo import conninfo_to_dict

    from sinks.sql.config import sql_sink_config
    from stores.sql import connect

    sconf = conf.reader_sql_connection()
    role = conninfo_to_dict(sconf.dsn).get("user", "?")
    try:
        conn = connect(sconf)
    except Exception as exc:  # noqa: BLE001 (a refused login is this check's finding)
        section = "reader.sql" if conf.reader.sql else "sql"
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [DoctorLine("fail", "reader sql", f"role {role}: cannot connect ({text})", f"check {section} and its password")]
    with conn:
        conn.execute("SET default_transaction_read_only = on")  # nothing this session does can write
        superuser, powers = sql_role_powers(conn)
        checks = [_reader_sql_role(conf, role, superuser, powers)]
        for table in sorted({defs.entity_of(defs.source(s)).sql_table for s in sources}):
            config = replace(sql_sink_config(conf), table=table)
            rights = sql_table_rights(conn, config.table, config.schema)
            checks.append(_reader_sql_table(conf, role, f"reader sql {table}", config.table_name, rights, superuser))
    return checks


def _reader_sql_role(conf: RunConf, role: str, superuser: bool, powers: list[str]) -> DoctorLine:
    """Whether the reader's role may write anything whatever the tables' grants: a superuser,
    or a member of the roles that write files or run programs on the server."""
    said = "is a superuser: it may write every table, and files and programs on the server" if superuser else "; ".join(powers)
    if said and conf.reader.sql is None:
        create = f"create the fm_reader role (conf/base/sql-grants.sql) and set reader.sql ({LEAST_PRIVILEGE})"
        return DoctorLine("warn", "reader sql", f"reader.sql is not set: reads run as {role}, the writer's role, which {said}", create)
    if said:
        fix = f"give it the fm_reader role's grants only (conf/base/sql-grants.sql, {LEAST_PRIVILEGE})"
        return DoctorLine("fail", "reader sql", f"reader.sql role {role} {said}: reads need only SELECT", fix)
    return DoctorLine("ok", "reader sql", f"role {role} is not a superuser nor a member of {' or '.join(FILE_ROLES)}")


def _reader_sql_table(conf: RunConf, role: str, name: str, table: str, rights, superuser: bool) -> DoctorLine:
    if rights is None:
        return DoctorLine(
            "warn", name, f"{table} is not there yet: reads from the SQL store fail until a run (or materialize schema) makes it"
        )
    may_read, privileges, owner = rights
    if not may_read:
        fix = f"grant the fm_reader role's SELECT (conf/base/sql-grants.sql, {LEAST_PRIVILEGE})"
        return DoctorLine("fail", name, f"role {role} may not SELECT from {table}: reads fail", fix)
    said = " and ".join([f"may {', '.join(privileges)} {table}"] * bool(privileges) + [f"owns {table}"] * owner)
    if superuser:
        said = f"may write {table} (a superuser)"
    if said and conf.reader.sql is None:
        create = f"create the fm_reader role (conf/base/sql-grants.sql) and set reader.sql ({LEAST_PRIVILEGE})"
        return DoctorLine("warn", name, f"reader.sql is not set: reads run as {role}, the writer's role, which {said}", create)
    if said:
        fix = f"give it the fm_reader role's grants only (conf/base/sql-grants.sql, {LEAST_PRIVILEGE})"
        return DoctorLine("fail", name, f"reader.sql role {role} {said}: reads need only SELECT", fix)
    return DoctorLine("ok", name, f"role {role} may SELECT from {table} and nothing more (no other privilege on it, not its owner)")
