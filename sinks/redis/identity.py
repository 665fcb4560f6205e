"""What identifies a Redis and what it holds, read cheaply at any size, for the ledger to
record after each write and for later steps to compare with (jobs/operations/ledger/store_state.py).

Nothing here walks the keyspace: at billions of keys a ``SCAN`` per night is not
affordable, and the writer's ACL (conf/base/redis-acl.txt) grants no ``SCAN``. Instead:

- ``INFO server``/``persistence``/``keyspace`` of every primary: the run id (a restart or
  another server changes it), AOF and RDB state (a restart without either comes back
  empty; ``rdb_last_load_keys_loaded`` says how many keys the last start loaded), and the
  keys of the database (summed over a cluster's primaries);
- ``CONFIG GET appendonly save`` when the user may (else ``None``: INFO still says whether
  AOF is on);
- whether a small sample of the keys a write wrote still hold its source's freshness
  field (``HMGET``, one pipeline per node): a per-source, per-prefix answer that costs the
  same on a thousand keys as on a billion.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis

from sinks.redis.config import RedisSinkConfig
from sinks.redis.router import ClusterTopology, KeyRouter, cluster_mode
from stores.redis import connect, info_once_loaded, node_address


def database(url: str) -> int:
    return int((urlsplit(url).path or "/0").strip("/") or 0)


def observe(config: RedisSinkConfig, cluster: bool | None = None) -> dict[str, Any]:
    """The server(s) of ``config`` as they are now: ``{"servers": {address: run_id}, "db",
    "keys", "aof", "save", "rdb_last_save", "keys_loaded", "uptime"}`` (a cluster: keys and
    loaded keys summed over the primaries, the smallest uptime)."""
    cluster = cluster_mode(config, cluster)
    addresses: list[str | None] = list(ClusterTopology.discover(config).primaries) if cluster else [None]
    db = 0 if cluster else database(config.url)
    out: dict[str, Any] = {"servers": {}, "db": db, "keys": 0, "aof": False, "save": None, "rdb_last_save": 0, "keys_loaded": 0}
    uptimes = []
    for address in addresses:
        client = connect(config, address)
        try:
            info = info_once_loaded(client, "server", "keyspace")
            try:
                settings = client.config_get("appendonly") | client.config_get("save")
            except redis.ResponseError:  # NOPERM: the writer's ACL has no CONFIG
                settings = None
        finally:
            client.close()
        out["servers"][address or node_address(config.url)] = str(info.get("run_id", ""))
        out["keys"] += int((info.get(f"db{db}") or {}).get("keys", 0))
        out["aof"] = out["aof"] or bool(int(info.get("aof_enabled", 0)))
        out["rdb_last_save"] = max(out["rdb_last_save"], int(info.get("rdb_last_save_time", 0)))
        out["keys_loaded"] += int(info.get("rdb_last_load_keys_loaded", 0))
        if settings is not None:
            out["save"] = str(settings.get("save", ""))
        uptimes.append(int(info.get("uptime_in_seconds", 0)))
    out["uptime"] = min(uptimes)
    return out


def holding(config: RedisSinkConfig, cluster: bool, keys: list[str], field: bytes) -> int:
    """How many of ``keys`` hold ``field`` (a source's freshness field) now."""
    if not keys:
        return 0
    router = KeyRouter(config, cluster)
    try:
        replies = router.run([k.encode() for k in keys], lambda pipe, key: pipe.hmget(key, [field]))
    finally:
        router.close()
    return sum(1 for reply in replies if reply and reply[0] is not None)


def persistence_text(seen: dict[str, Any]) -> str:
    """What a restart of this server keeps, from an observation."""
    if seen.get("aof"):
        return "AOF on"
    if seen.get("save"):
        return f"AOF off, RDB save points {seen['save']!r}"
    if seen.get("save") == "":
        return "AOF off, no RDB save points"
    return "AOF off (save points not readable by this user)"
