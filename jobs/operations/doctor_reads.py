"""``materialize doctor``, the read side: what the reader library and ``materialize serve``
connect with, and what a Redis they read from holds and risks.

Nothing is written, and no check needs an admin user:

- The reader's Redis user is probed with commands that could not change anything even if
  they were allowed: Redis checks a command's ACL before running it, and each probe, when
  run, is a no-op on a key that cannot exist (a random name under each entity's prefix):
  ``HDEL``/``DEL``/``EXPIRE`` of a missing key, ``HSET`` with an odd number of arguments
  and ``SET ... NX XX`` (refused by the command itself, after the ACL check), ``EVALSHA``
  of a script that is not loaded. ``NOPERM`` means refused; any other answer, allowed.
  (``ACL DRYRUN`` and ``ACL GETUSER`` would say the same but need an admin user.)
- The reader's SQL role is asked ``has_table_privilege`` in a read-only session.
- ``rediss://`` at a plain port, or ``redis://`` at a TLS one, is found by sending ``PING``
  in plain text on a socket of its own: a plain Redis answers RESP, a TLS one closes it.
- Whether the database holds the project's keys: ``SCAN MATCH <prefix>*`` (bounded) when
  the user may, else ``INFO keyspace`` (conf/base/redis-acl.txt grants no SCAN).
- Persistence: ``CONFIG GET`` when the user may, else ``INFO persistence``.
- The default user: a connection without credentials, then the same no-op probes plus
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
from jobs.operations.check import Check, Status

LEAST_PRIVILEGE = "conf/README.md 'Least privilege'"
SCAN_BATCHES = 10
SCAN_COUNT = 1000
"""At most SCAN_BATCHES x SCAN_COUNT keys are visited looking for the project's."""


def read_side_steps(conf: RunConf, defs: Definitions, sources: list[str], sinks: list[str]) -> list[tuple[str, Callable[[], list[Check]]]]:
    """(name, step) of the read side's checks, for doctor's run_checks (the redis transport
    check runs before the writer's, with it)."""
    steps: list[tuple[str, Callable[[], list[Check]]]] = []
    if "redis" in sinks:
        steps.append(("reader redis", lambda: redis_read_checks(conf, defs, sources)))
    if "cockroach" in sinks:
        steps.append(("reader sql", lambda: check_reader_sql(conf, defs, sources)))
    return steps


def redis_read_checks(conf: RunConf, defs: Definitions, sources: list[str]) -> list[Check]:
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
            checks.append(Check("fail", name, f"could not check: {type(exc).__name__}: {str(exc).strip() or 'no message'}"))
    return checks


# -- Redis: the port speaks what the URL says ---------------------------------------------


def check_redis_transport(conf: RunConf) -> list[Check]:
    """redis.url's scheme against what its port speaks (nothing when nothing answers there:
    the redis check says so)."""
    where, state = _transport(conf)
    if state == "unreachable" or not conf.redis.url.startswith(("redis://", "rediss://")):
        return []
    if state == "mismatch-plain":
        return [
            Check(
                "fail",
                "redis transport",
                f"redis.url is rediss:// but {where} answers plain Redis: no TLS on that port",
                "use redis:// for that port, or the port the server takes TLS on (its tls-port)",
            )
        ]
    if state == "mismatch-tls":
        return [
            Check(
                "fail",
                "redis transport",
                f"redis.url is redis:// but {where} speaks TLS only (it dropped a plain PING)",
                "use rediss:// (and redis.tls_ca_file for a private CA)",
            )
        ]
    if state == "unknown":
        return [Check("warn", "redis transport", f"{where}: answered a plain PING with neither Redis nor TLS, or not in 3 s: is it Redis?")]
    speaks = "TLS" if conf.redis.url.startswith("rediss") else "plain Redis"
    return [Check("ok", "redis transport", f"{where}: {speaks}, as redis.url says")]


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


WRITES = ("HSET", "HDEL", "DEL", "EXPIRE", "SET", "EVALSHA")


def _write_probes(key: bytes) -> list[tuple]:
    """Writes that change nothing even when allowed (see the module's docstring)."""
    return [
        ("HSET", key, b"f", b"v", b"odd-argument-count"),
        ("HDEL", key, b"f"),
        ("DEL", key),
        ("EXPIRE", key, 1),
        ("SET", key, b"v", b"NX", b"XX"),
        ("EVALSHA", "0" * 40, 1, key),
    ]


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


def check_reader_redis(conf: RunConf, defs: Definitions, sources: list[str]) -> tuple[list[Check], bool]:
    """(checks, whether the reader's user could connect)."""
    import redis

    from serializers.keys import key_prefix
    from stores.redis import connect, server_address

    creds = conf.reader.redis
    rconf = conf.reader_redis_connection()  # a missing password fails here, naming where it was looked for
    user = rconf.username or "default"
    where = server_address(rconf.url)
    client = connect(rconf, socket_timeout=5.0)
    try:
        try:
            client.ping()
        except redis.AuthenticationError as exc:
            section = "reader.redis" if creds else "redis"
            return [
                Check(
                    "fail",
                    "reader redis",
                    f"{where}: user {user}: authentication refused ({exc})",
                    f"check {section}.username and the password in {section}.password_env/_file",
                )
            ], False
        except redis.ConnectionError as exc:
            return [Check("fail", "reader redis", f"{where}: cannot connect ({exc})", "start Redis or fix redis.url")], False
        except redis.exceptions.NoPermissionError:
            pass  # PING refused: the reader's health check would fail, said below
        entities = {defs.entity_of(defs.source(s)).prefix for s in sources}
        unreadable, writable = [], set()
        for prefix in sorted(entities):
            key = _probe_key(conf, prefix)
            if not probe(client, "HMGET", key, b"f"):
                unreadable.append(key_prefix(prefix, conf.redis.namespace) + "*")
            writable |= {args[0] for args in _write_probes(key) if probe(client, *args)}
        pattern = " and ".join(key_prefix(p, conf.redis.namespace) + "*" for p in sorted(entities))
        other = [] if probe(client, "PING") else ["PING (the server's /health)"]
    finally:
        client.close()
    checks = []
    if unreadable or other:
        what = [f"HMGET on {', '.join(unreadable)}"] if unreadable else []
        checks.append(
            Check(
                "fail",
                "reader redis",
                f"user {user} may not run {', '.join(what + other)}: reads fail",
                f"grant the fm_reader ACL (conf/base/redis-acl.txt, {LEAST_PRIVILEGE})",
            )
        )
    written = ", ".join(sorted(writable))
    if creds is None:
        checks.append(
            Check(
                "warn",
                "reader redis",
                f"reader.redis is not set: reads run as {user}, the writer's user"
                + (f", which may also write {pattern} ({written})" if writable else ""),
                f"create the fm_reader user (conf/base/redis-acl.txt) and set reader.redis ({LEAST_PRIVILEGE})",
            )
        )
    elif writable:
        checks.append(
            Check(
                "fail",
                "reader redis",
                f"reader.redis user {user} may write {pattern} ({written}): reads need none of that",
                f"give it the fm_reader ACL (conf/base/redis-acl.txt, {LEAST_PRIVILEGE})",
            )
        )
    if not checks:
        checks.append(Check("ok", "reader redis", f"user {user} may read {pattern} and may not write them ({', '.join(WRITES)} refused)"))
    return checks, True


# -- Redis: the database holds the project's keys, persistence, the default user ------------


def check_redis_keys(conf: RunConf, defs: Definitions, sources: list[str]) -> Check:
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
        return Check(
            "warn",
            "redis keys",
            f"database {db} is empty: no run has written it yet, or reads look in the wrong place"
            + (f" (keys are in: {others})" if others else ""),
            "run the nightly job (materialize run), or " + fix,
        )
    if not scanned:
        return Check(
            "ok",
            "redis keys",
            f"database {db} holds {held[db]:,} keys (whether {named} among them was not checked: this user may not SCAN)",
        )
    if not found:
        return Check(
            "warn",
            "redis keys",
            f"database {db} holds {held[db]:,} keys, none of them {named}"
            + ("" if complete else f" among the first {SCAN_BATCHES * SCAN_COUNT:,} visited"),
            fix,
        )
    missing = [p + "*" for p in prefixes if p not in found]
    if missing:
        seen = ", ".join(sorted(p + "*" for p in found))
        return Check("warn", "redis keys", f"database {db}: {seen} found, no {', '.join(missing)} yet", fix)
    return Check("ok", "redis keys", f"database {db}: {named} found ({held[db]:,} keys)")


def check_redis_persistence(conf: RunConf) -> Check:
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
        return Check("ok", "redis persistence", "AOF on: a restart keeps what was written")
    if config is not None:
        if config.get("save"):
            return Check("ok", "redis persistence", f"AOF off, RDB snapshots on (save {config['save']}): a restart keeps the last snapshot")
        return Check(
            "warn", "redis persistence", "no persistence (AOF off, no save points): a restart empties Redis until the next run", fix
        )
    saves = int(info.get("rdb_saves", 0))
    if saves:
        return Check("ok", "redis persistence", f"AOF off; {saves} RDB snapshot(s) since the server started (CONFIG GET refused)")
    return Check(
        "warn",
        "redis persistence",
        f"AOF off and no RDB snapshot in the {uptime:,} s since the server started (its save points could not be read: "
        "CONFIG GET refused to this user): a restart may empty Redis until the next run",
        fix,
    )


def check_default_user(conf: RunConf) -> Check:
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
            return Check("ok", "redis default user", f"{where}: a connection without a password may not run commands")
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
        return Check("ok", "redis default user", f"{where}: the default user needs no password but may not write or change the config")
    status: Status = "warn" if _loopback(urlsplit(rconf.url).hostname or "") else "fail"
    return Check(
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


def check_reader_sql(conf: RunConf, defs: Definitions, sources: list[str]) -> list[Check]:
    from psycopg.conninfo import conninfo_to_dict

    from sinks.sql.config import sql_sink_config
    from stores.sql import connect

    creds = conf.reader.sql
    sconf = conf.reader_sql_connection()
    info = conninfo_to_dict(sconf.dsn)
    role = info.get("user", "?")
    try:
        conn = connect(sconf)
    except Exception as exc:  # noqa: BLE001 (a refused login is this check's finding)
        section = "reader.sql" if creds else "sql"
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [Check("fail", "reader sql", f"role {role}: cannot connect ({text})", f"check {section} and its password")]
    checks: list[Check] = []
    with conn:
        conn.execute("SET default_transaction_read_only = on")  # nothing this session does can write
        tables = sorted({defs.entity_of(defs.source(s)).sql_table for s in sources})
        for table in tables:
            config = replace(sql_sink_config(conf), table=table)
            row = conn.execute(
                "SELECT has_table_privilege(c.oid, 'SELECT'), has_table_privilege(c.oid, 'INSERT'), has_table_privilege(c.oid, 'UPDATE'), "
                "has_table_privilege(c.oid, 'DELETE') "
                "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
                "WHERE c.relname = %s AND n.nspname = COALESCE(%s, current_schema())",
                (config.table, config.schema),
            ).fetchone()
            if row is None:
                checks.append(
                    Check(
                        "warn",
                        f"reader sql {table}",
                        f"{config.table_name} is not there yet: reads from the SQL store fail until a run (or materialize schema) makes it",
                    )
                )
                continue
            may_read, *writes = row
            writable = [name for name, ok in zip(("INSERT", "UPDATE", "DELETE"), writes) if ok]
            if not may_read:
                checks.append(
                    Check(
                        "fail",
                        f"reader sql {table}",
                        f"role {role} may not SELECT from {config.table_name}: reads fail",
                        f"grant the fm_reader role's SELECT (conf/base/sql-grants.sql, {LEAST_PRIVILEGE})",
                    )
                )
            elif writable and creds is None:
                checks.append(
                    Check(
                        "warn",
                        f"reader sql {table}",
                        f"reader.sql is not set: reads run as {role}, the writer's role, "
                        f"which may {', '.join(writable)} {config.table_name}",
                        f"create the fm_reader role (conf/base/sql-grants.sql) and set reader.sql ({LEAST_PRIVILEGE})",
                    )
                )
            elif writable:
                checks.append(
                    Check(
                        "fail",
                        f"reader sql {table}",
                        f"reader.sql role {role} may {', '.join(writable)} {config.table_name}: reads need only SELECT",
                        f"give it the fm_reader role's grants only (conf/base/sql-grants.sql, {LEAST_PRIVILEGE})",
                    )
                )
            else:
                checks.append(Check("ok", f"reader sql {table}", f"role {role} may SELECT from {config.table_name} and not write it"))
    return checks
