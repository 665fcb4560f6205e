"""``materialize doctor``: what the read side's Redis user and SQL role could change, judged
whole, without changing anything (reads.py reports it).

Redis: every command of the ``@write`` and ``@dangerous`` categories (``COMMAND LIST``;
``INFO`` aside, which the reader's ACL grants for its reads, and ``EVALSHA`` added, the
writer's way in), each judged

- by ``ACL DRYRUN <user> <command> <args>`` on the first connection here that may run it
  (the reader's user, the writer's, the default user without a password): Redis checks the
  user's ACL against the command and runs nothing;
- else by running it where Redis refuses it before it runs: a command with keys, on a key
  no pattern of the user lets it read (Redis checks the command, then its keys: refused
  either way, and "no permissions to access" a key means the command itself is allowed),
  once ``HMGET`` of that key is refused for the key; a command without keys, in a form its
  own argument check refuses after the ACL check (FLUSHALL with a bad option, CONFIG SET of
  a parameter that does not exist). The other commands without keys (SHUTDOWN, CONFIG
  REWRITE, ...) have no such form: they are named as not tried. Arguments too few for a
  command tell nothing: Redis counts arguments before it checks the ACL.

SQL: every table privilege beyond SELECT (column grants included), owning the table,
superuser, and membership in the roles that write files or run programs on the server.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass

GRANTED_READS = {"info"}
"""@dangerous commands the reader's documented ACL grants (INFO: the cluster check, doctor's persistence)."""
ADDED = ("evalsha",)
"""Not in @write, but how the writer writes (a script's commands are checked against the ACL too)."""


@dataclass
class RedisRights:
    commands: int
    """How many commands there are to judge."""
    allowed: list[str]
    """Those the user may run (``FLUSHALL``, ``CONFIG SET``)."""
    untried: list[str]
    """Those neither judged nor tried."""
    writes: set[str]
    """The @write commands (and EVALSHA) among all of them."""
    how: str
    """How they were judged, for the report."""
    dryrun: bool
    """Judged by ACL DRYRUN."""
    why_untried: str


def redis_rights(client, user: str, others: list[Callable], key: bytes) -> RedisRights | None:
    """``user``'s @write and @dangerous commands, judged on ``client`` (its connection) or one
    of ``others`` (factories of other connections, tried in turn; each may raise). ``key``:
    a key name under a prefix the user reads (ACL DRYRUN's). None: no connection here may
    list the commands (``COMMAND``)."""
    opened, usable, pending = [], [client], list(others)

    def connections():
        """``client``, then the others that log in, each opened once."""
        at = 0
        while True:
            while at == len(usable) and pending:
                with suppress(Exception):  # a user that cannot log in is not a judge
                    opened.append(other := pending.pop(0)())
                    other.ping()
                    usable.append(other)
            if at == len(usable):
                return
            yield usable[at]
            at += 1

    try:
        lister, commands = next(((conn, found) for conn in connections() if (found := _commands(conn)) is not None), (None, None))
        if commands is None:
            return None
        judge = next((conn for conn in connections() if _may_dryrun(conn, user)), None)
        writes = {_display(name) for name, info in commands.items() if b"@write" in info[6] or name in ADDED}
        if judge is not None:
            allowed, untried = _dryrun(judge, user, commands, key)
            who = judge.connection_pool.connection_kwargs.get("username") or "default"
            return RedisRights(len(commands), allowed, untried, writes, f"ACL DRYRUN as {who}", True, "ACL DRYRUN said neither yes nor no")
        allowed, untried, why = _tried(client, lister, commands)
        return RedisRights(len(commands), allowed, untried, writes, "each tried where Redis refuses it before it runs", False, why)
    finally:
        for conn in opened:
            conn.close()


def _commands(conn) -> dict[str, list] | None:
    """Command name (``config|set``) -> its COMMAND INFO entry; None when COMMAND is refused."""
    import redis

    try:
        names = set(ADDED)
        for category in ("write", "dangerous"):
            names |= {n.decode() for n in conn.execute_command("COMMAND LIST", "FILTERBY", "ACLCAT", category)}
        names -= GRANTED_READS
        ordered = sorted(names)
        infos = conn.execute_command("COMMAND INFO", *ordered)
    except redis.ResponseError:  # NOPERM, or a Redis before 7.0
        return None
    return {name: info for name, info in zip(ordered, infos) if info}


def _may_dryrun(conn, user: str) -> bool:
    import redis

    try:
        return conn.execute_command("ACL DRYRUN", user, "PING") is not None
    except redis.ResponseError:  # NOPERM; "User ... not found" cannot be: the user logged in
        return False


def _args(name: str, info: list, filler: bytes) -> list:
    """``name``'s words then ``filler`` as often as its arity asks (at least once when it takes keys)."""
    words = name.split("|")
    arity = int(info[1])
    needed = (arity if arity > 0 else -arity) - len(words)
    if _has_keys(info):
        needed = max(needed, 1)
    return [*words, *[filler] * max(needed, 0)]


def _has_keys(info: list) -> bool:
    return int(info[3]) > 0 or b"movablekeys" in info[2]


def _display(name: str) -> str:
    return name.replace("|", " ").upper()


def _dryrun(judge, user: str, commands: dict[str, list], key: bytes) -> tuple[list[str], list[str]]:
    pipe = judge.pipeline(transaction=False)
    for name, info in commands.items():
        pipe.execute_command("ACL DRYRUN", user, *_args(name, info, key))
    allowed, untried = [], []
    for name, reply in zip(commands, pipe.execute(raise_on_error=False)):
        text = reply.decode(errors="replace") if isinstance(reply, bytes) else str(reply)
        if reply == b"OK" or "permissions to access" in text:  # the command is allowed; a key or channel is not
            allowed.append(_display(name))
        elif "permissions to run" not in text:
            untried.append(_display(name))
    return allowed, untried


def _keyless_probes() -> dict[str, tuple]:
    """Commands without keys, each in a form that its own checks refuse after the ACL's, or
    that only reads."""
    odd, nobody = "__fm_doctor_probe__" + secrets.token_hex(8), "18446744073709551615"  # no such name; no such client
    refused = {
        "flushall": ("FLUSHALL", odd),  # the only options are SYNC and ASYNC
        "flushdb": ("FLUSHDB", odd),
        "swapdb": ("SWAPDB", odd, odd),  # not a database number
        "config|set": ("CONFIG", "SET", odd, "x"),  # no such parameter
        "function|delete": ("FUNCTION", "DELETE", odd),  # no such library
        "function|flush": ("FUNCTION", "FLUSH", odd),
        "function|load": ("FUNCTION", "LOAD", odd),  # no library header
        "function|restore": ("FUNCTION", "RESTORE", odd),  # not a dump
        "acl|deluser": ("ACL", "DELUSER", odd),  # no such user: deletes nothing
        "acl|dryrun": ("ACL", "DRYRUN", odd, "PING"),
        "acl|log": ("ACL", "LOG", odd),  # not a count (RESET would clear it)
        "client|kill": ("CLIENT", "KILL", "ID", nobody),
        "client|unblock": ("CLIENT", "UNBLOCK", nobody),
        "client|pause": ("CLIENT", "PAUSE", odd),  # not a timeout
        "client|no-evict": ("CLIENT", "NO-EVICT", odd),
        "client|list": ("CLIENT", "LIST", "ID", nobody),
        "bgsave": ("BGSAVE", odd),  # the only option is SCHEDULE
        "replicaof": ("REPLICAOF", odd, odd),  # not a port
        "slaveof": ("SLAVEOF", odd, odd),
        "failover": ("FAILOVER", odd),
        "latency|reset": ("LATENCY", "RESET", odd),  # no such event: resets nothing
    }
    reads = ("config|get", "acl|getuser", "latency|history", "latency|graph", "latency|histogram")
    only_read = {name: (*name.upper().split("|"), odd) for name in reads}
    only_read |= {name: tuple(name.upper().split("|")) for name in ("acl|users", "acl|list", "slowlog|len", "lastsave", "role",
                                                                    "latency|latest", "latency|doctor", "module|list")}  # fmt: skip
    return refused | only_read


NO_OP_ON_A_MISSING_KEY = {
    "del", "unlink", "hdel", "expire", "pexpire", "expireat", "pexpireat", "persist", "srem", "zrem", "lrem", "lpop", "rpop",
    "spop", "zpopmin", "zpopmax", "getdel", "xdel", "lpushx", "rpushx", "ltrim", "xtrim",
}  # fmt: skip
"""Tried first: when one of them runs on the key outside, that key is writable and no other is tried."""


def _tried(client, lister, commands: dict[str, list]) -> tuple[list[str], list[str], str]:
    """(allowed, untried, why untried): each command run where Redis refuses it before it runs
    (the module's docstring)."""
    import redis

    outside = b"__fm_doctor_outside__:" + secrets.token_hex(8).encode()
    try:
        client.execute_command("HMGET", outside, b"f")
        keys_refused = False  # it may read a key outside the prefixes: a command on it could run
    except redis.exceptions.NoPermissionError as exc:
        keys_refused = "permissions to access" in str(exc)
    keyed = {name: info for name, info in commands.items() if _has_keys(info)}
    probes = _key_probes(lister, keyed, outside) if keys_refused else {}
    keyless = _keyless_probes()
    probes |= {name: keyless[name] for name in commands if name in keyless and name not in keyed}
    first = {name: args for name, args in probes.items() if name in NO_OP_ON_A_MISSING_KEY or name not in keyed}
    replies = _run(client, first)
    why = "no user here may run ACL DRYRUN, and this user may read keys outside its prefixes: a command on one could run"
    if any(name in keyed and not isinstance(reply, redis.exceptions.NoPermissionError) for name, reply in replies.items()):
        why = "a command that does nothing on a missing key ran on one outside its prefixes: this user may write keys it cannot read"
    elif keys_refused:
        replies |= _run(client, {name: args for name, args in probes.items() if name not in first})
    allowed = [_display(name) for name in commands if name in replies and not _refused(replies[name])]
    return allowed, [_display(name) for name in commands if name not in replies], why


def _run(client, probes: dict[str, list]) -> dict:
    pipe = client.pipeline(transaction=False)
    for args in probes.values():
        pipe.execute_command(*args)
    return dict(zip(probes, pipe.execute(raise_on_error=False))) if probes else {}


def _refused(reply) -> bool:
    """Whether Redis refused the command itself (not only a key: that is after the command's own check)."""
    import redis

    return isinstance(reply, redis.exceptions.NoPermissionError) and "permissions to run" in str(reply)


def _key_probes(lister, keyed: dict[str, list], outside: bytes) -> dict[str, list]:
    """Command -> arguments in which Redis finds keys, every one of them ``outside`` (``COMMAND
    GETKEYS``, as the ACL check finds them: where it finds none, it checks none, so such
    arguments are never sent). Each command's words, then ``outside`` as often as its arity
    asks (two more when it takes any number), or with a count of keys (1) or a keyword in
    one place."""
    found: dict[str, list] = {}
    for name, info in keyed.items():
        words, arity = name.split("|"), int(info[1])
        size = max((arity if arity > 0 else -arity + 2) - len(words), 1)
        keywords = [spec[b"begin_search"][b"spec"][b"keyword"] for spec in info[8] if spec[b"begin_search"][b"type"] == b"keyword"]
        fillers = [[outside] * size]
        fillers += [[outside] * j + [word] + [outside] * (size - j - 1) for j in range(size) for word in [b"1", *keywords]]
        for filler in fillers:
            if _keys(lister, [*words, *filler]) == outside:
                found[name] = [*words, *filler]
                break
    return found


def _keys(lister, args: list) -> bytes | None:
    """The one key name Redis finds in ``args`` (None: none, or more than one name)."""
    import redis

    try:
        keys = {k.encode() if isinstance(k, str) else k for k in lister.execute_command("COMMAND GETKEYS", *args)}
    except redis.ResponseError:  # no key found in these arguments
        return None
    return keys.pop() if len(keys) == 1 else None


# -- SQL --------------------------------------------------------------------------------------

FILE_ROLES = {
    "pg_write_server_files": "writes files on the server (COPY ... TO a file)",
    "pg_execute_server_program": "runs programs on the server (COPY ... TO PROGRAM)",
}
TABLE_PRIVILEGES = ("INSERT", "UPDATE", "DELETE", "TRUNCATE", "REFERENCES", "TRIGGER")
COLUMN_PRIVILEGES = {"INSERT", "UPDATE", "REFERENCES"}
"""Grantable on single columns too: any column's grant counts."""


def sql_role_powers(conn) -> tuple[bool, list[str]]:
    """(superuser, what its membership in FILE_ROLES lets the session's role do)."""
    superuser = conn.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user").fetchone()
    rows = conn.execute(
        "SELECT rolname FROM pg_catalog.pg_roles WHERE rolname = ANY(%s) AND pg_has_role(oid, 'MEMBER') ORDER BY rolname",
        (list(FILE_ROLES),),
    ).fetchall()
    return bool(superuser and superuser[0]), [f"is a member of {name}: {FILE_ROLES[name]}" for (name,) in rows]


def sql_table_rights(conn, table: str, schema: str | None) -> tuple[bool, list[str], bool] | None:
    """(may SELECT, privileges beyond SELECT, owns it) of the session's role on ``table``;
    None when there is no such table."""
    privileges = [*TABLE_PRIVILEGES, *(["MAINTAIN"] if conn.info.server_version >= 170000 else [])]
    checks = ", ".join(
        f"has_{'any_column' if p in COLUMN_PRIVILEGES else 'table'}_privilege(c.oid, '{p}')" for p in ("SELECT", *privileges)
    )
    row = conn.execute(
        f"SELECT {checks}, pg_has_role(c.relowner, 'MEMBER') "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = %s AND n.nspname = COALESCE(%s, current_schema())",
        (table, schema),
    ).fetchone()
    if row is None:
        return None
    may_read, *beyond, owner = row
    return bool(may_read), [p for p, ok in zip(privileges, beyond) if ok], bool(owner)


def writer_denied(client, key: bytes) -> tuple[list[str], list[str]]:
    """(denied, unchecked): which of the writer's and verifier's commands this user may not
    run on ``key``, and which could not be tried without writing.

    Queued in a MULTI that is discarded: Redis checks the ACL when it queues a command (and
    answers MOVED only after that, so a redirect means allowed), and nothing queued runs. A
    user without MULTI (conf/base/redis-acl.txt grants +multi +discard, never +exec) gets
    the commands that do nothing on a missing key instead, HSET and SCRIPT LOAD unchecked."""
    import redis

    from serializers.resp import WRITE_SCRIPT, WRITE_SCRIPT_SHA

    probes: list[tuple] = [
        ("INFO", "memory"), ("SCRIPT", "LOAD", WRITE_SCRIPT), ("EVALSHA", WRITE_SCRIPT_SHA, 1, key, 0, "not-a-number"),
        ("HGET", key, b"f"), ("HSET", key, b"f", b"v"), ("HDEL", key, b"f"), ("EXPIRE", key, 1), ("PERSIST", key),
        ("HLEN", key), ("HMGET", key, b"f"), ("HGETALL", key), ("MEMORY", "USAGE", key), ("OBJECT", "ENCODING", key),
    ]  # fmt: skip
    conn = client.connection_pool.get_connection()
    denied: list[str] = []
    unchecked: list[str] = []

    def call(*args):
        conn.send_command(*args)
        return conn.read_response()

    try:
        try:
            call("MULTI")
            queued = True
        except redis.exceptions.NoPermissionError:
            queued = False
            absent = _allowed(lambda: call("HLEN", key) == 0)
            # on a missing key these do nothing; HSET and SCRIPT LOAD would write
            unchecked = [_name(a) for a in probes if a[0] in ("HSET", "SCRIPT") or (not absent and a[0] in ("HDEL", "EXPIRE", "PERSIST"))]
        for args in probes:
            if _name(args) in unchecked:
                continue
            try:
                call(*args)  # queued, or (no MULTI) harmless: the script stops at its bad argument
            except redis.exceptions.NoPermissionError:
                denied.append(_name(args))
            except redis.ResponseError:
                pass  # MOVED, NOSCRIPT, the script's error: past the permission check
        if queued:
            call("DISCARD")
    finally:
        client.connection_pool.release(conn)
    return denied, unchecked


def _name(args: tuple) -> str:
    return " ".join(str(a) for a in args[:2]) if args[0] in ("SCRIPT", "MEMORY", "OBJECT") else args[0]


def _allowed(probe: Callable[[], bool]) -> bool:
    import redis

    try:
        return probe()
    except redis.ResponseError:
        return False
