"""Redis: reachable with the writer's credentials, in the mode configured, every slot served,
room on every primary, no eviction of this run's keys, hashes in the listpack encoding, and
the writer's ACL (probed in a MULTI that is discarded: nothing is written)."""

from __future__ import annotations

from feature_defs import Definitions
from fm_config import RunConf
from jobs.operations.doctor.line import DoctorLine, Status
from jobs.operations.doctor.rights import writer_denied
from sinks.redis.config import redis_sink_config


def check_redis(conf: RunConf, defs: Definitions, sources: list[str]) -> list[DoctorLine]:
    """Connect, then each check in turn; the memory checks on every primary of a cluster."""
    from sinks.redis.router import is_cluster
    from stores.redis import connect, server_address

    config = redis_sink_config(conf)  # a missing password fails here, naming where it was looked for
    where = server_address(config.url)
    client = connect(config, socket_timeout=5.0)
    nodes: list[tuple[str, object]] = []
    try:
        version, refused = _server_version(client, where)
        if refused:
            return [refused]
        cluster = is_cluster(client)
        findings = [DoctorLine("ok", "redis", f"{where}: Redis {version}, {'cluster' if cluster else 'standalone'}")]
        findings += _mode(conf.redis.mode, cluster)
        nodes = [(where, client)]
        if cluster:
            topology, served = _cluster_slots(config)
            findings.append(served)
            nodes = [(a, connect(config, a, socket_timeout=5.0)) for a in sorted(topology.primaries)]
        entities = {defs.entity_of(defs.source(s)).name: defs.entity_of(defs.source(s)) for s in sources}
        ttl = any(e.ttl_seconds for e in entities.values())
        seen = None
        for address, node in nodes:
            memory, found = _memory(conf, node, address if cluster else None, ttl)
            findings += found
            if seen is None:  # listpack settings: one check, from the first primary that answered
                seen = memory
            if not cluster and memory is not None:
                break
        if seen is not None:
            findings += _listpack_settings(conf, defs, sources, seen)
        for entity in entities.values():  # asked of the node that answered (in a cluster, MOVED comes after the ACL check)
            findings.append(_writer_acl(conf, client, entity))
        return findings
    finally:
        for node in {id(n): n for _, n in nodes}.values():
            node.close()
        client.close()


def _server_version(client, where: str) -> tuple[str, DoctorLine | None]:
    """The server's version, or the FAIL of a connection or login refused."""
    import redis

    try:
        return client.info("server").get("redis_version", "?"), None
    except redis.AuthenticationError as exc:
        return "", DoctorLine(
            "fail", "redis", f"{where}: authentication refused ({exc})", "check redis.username and the password in redis.password_env/_file"
        )
    except redis.ConnectionError as exc:
        return "", DoctorLine(
            "fail", "redis", f"{where}: cannot connect ({exc})", "start Redis or fix redis.url (and TLS files for rediss://)"
        )


def _mode(mode: str, cluster: bool) -> list[DoctorLine]:
    if mode == "auto" or (mode == "cluster") == cluster:
        return []
    found = "a cluster node" if cluster else "standalone"
    return [DoctorLine("fail", "redis mode", f"redis.mode is {mode} but the server is {found}", "set redis.mode: auto")]


def _cluster_slots(config):
    """The cluster's topology, and whether every slot has a primary."""
    from sinks.redis.router import ClusterTopology

    topology = ClusterTopology.discover(config)
    unserved = topology.unserved()
    if unserved:
        return topology, DoctorLine(
            "fail",
            "redis cluster",
            f"{unserved} of 16384 slots have no primary",
            "bring the cluster back to cluster_state:ok (a replica takes over, or CLUSTER ADDSLOTS)",
        )
    return topology, DoctorLine("ok", "redis cluster", f"{len(topology.primaries)} primaries serve every slot")


def _memory(conf: RunConf, node, address: str | None, ttl: bool):
    """Room on one node (``address``: a cluster's primary, None: the standalone server) and
    its eviction policy; the memory info, None when it could not be read."""
    import redis

    from sinks.errors import CapacityError
    from sinks.redis.capacity import read_memory_info

    settings = conf.redis
    label = f"redis memory {address}" if address else "redis memory"
    try:
        memory = read_memory_info(node, settings.hash_max_listpack_entries, settings.hash_max_listpack_value)
        capacity = memory.capacity(settings.capacity_bytes)
    except CapacityError as exc:
        return None, [DoctorLine("fail", label, str(exc).split(":")[0], "set maxmemory on the server, or redis.capacity_bytes")]
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        fix = "bring the node back, or let a replica take over its slots (a run writes the other primaries)"
        return None, [DoctorLine("fail", label, f"does not answer ({exc})", fix)]
    except redis.RedisError as exc:
        return None, [DoctorLine("fail", label, f"cannot read INFO: {exc}", "grant this user INFO (conf/README.md 'Least privilege')")]
    fill = memory.used / capacity
    status: Status = "fail" if fill >= settings.max_fill else "ok"
    found = [
        DoctorLine(
            status,
            label,
            f"{memory.used:,} of {capacity:,} B used ({fill:.0%}; a write may fill up to redis.max_fill {settings.max_fill:.0%})",
            "free memory or raise maxmemory before the run",
        )
    ]
    if memory.evicts(ttl):
        refuse = settings.eviction == "refuse"
        found.append(
            DoctorLine(
                "fail" if refuse else "warn",
                f"redis eviction {address}" if address else "redis eviction",
                f"maxmemory-policy {memory.policy} may evict this run's keys" + (": a run refuses to write" if refuse else ""),
                "set maxmemory-policy noeviction (or volatile-* with entity types without a TTL)",
            )
        )
    return memory, found


def _listpack_settings(conf: RunConf, defs: Definitions, sources: list[str], seen) -> list[DoctorLine]:
    """The server's listpack limits, when they could be read (else a warning: set them)."""
    settings = conf.redis
    if seen.listpack_note and settings.hash_max_listpack_entries is None and settings.hash_max_listpack_value is None:
        return [
            DoctorLine(
                "warn",
                "redis listpack",
                seen.listpack_note.split(";")[0] + f"; assumed entries {seen.listpack_entries}, value {seen.listpack_value}",
                "set redis.hash_max_listpack_entries/_value to the server's values",
            )
        ]
    return _listpack(defs, sources, seen.listpack_entries, seen.listpack_value)


def _writer_acl(conf: RunConf, client, entity) -> DoctorLine:
    """May the writer's user run the writer's commands on the entity's keys (probed, nothing written)?"""
    from serializers.keys import key_prefix

    settings = conf.redis
    keys = key_prefix(entity.prefix, settings.namespace)
    denied, unchecked = writer_denied(client, (keys + "__doctor_probe__").encode())
    user, label = settings.username or "default", f"redis acl {entity.name}"
    if denied:
        return DoctorLine(
            "fail",
            label,
            f"user {user} may not run {', '.join(denied)} on {keys}*",
            "grant the writer's ACL (conf/base/redis-acl.txt, conf/README.md 'Least privilege')",
        )
    if unchecked:
        return DoctorLine(
            "warn",
            label,
            f"user {user} may run the writer's commands on {keys}* except {', '.join(unchecked)}, which were not tried (MULTI refused)",
            "grant +multi +discard (never +exec) so they can be checked without writing",
        )
    return DoctorLine("ok", label, f"user {user} may run the writer's commands on {keys}*")


def _listpack(defs: Definitions, sources: list[str], entries: int, value_bytes: int) -> list[DoctorLine]:
    """Fields per entity hash (every source of the entity, each with its freshness field)
    against hash-max-listpack-entries: past it a hash takes about 4 times the memory."""
    fields: dict[str, int] = {}
    for name in defs.sources:
        source = defs.source(name)
        entity = defs.entity_of(source).name
        fields[entity] = fields.get(entity, 0) + len(source.features) + 1
    used = {defs.entity_of(defs.source(s)).name for s in sources}
    over = {e: n for e, n in fields.items() if e in used and n > entries}
    if over:
        listed = ", ".join(f"{e} {n}" for e, n in over.items())
        return [
            DoctorLine(
                "warn",
                "redis listpack",
                f"fields per hash ({listed}) pass hash-max-listpack-entries {entries}: "
                "those hashes use the hashtable encoding (about 4x memory)",
                f"raise hash-max-listpack-entries above {max(over.values())}",
            )
        ]
    return [
        DoctorLine(
            "ok",
            "redis listpack",
            f"hash-max-listpack-entries {entries}, value {value_bytes}: every entity's hash fits "
            f"({', '.join(f'{e} {n} fields' for e, n in fields.items() if e in used)})",
        )
    ]
