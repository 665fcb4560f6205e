"""Driver side, before any Redis write: mode (standalone or cluster), topology, capacity
projection, eviction policy, and the baselines every writer and the check after the last
write compare with. Returns the write plan; :func:`check_after_write` closes the write.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pyarrow as pa

from feature_defs import EntityDef
from fm_config.redis import RedisSettings
from serializers.batch import FeatureSpec, encode_batch
from sinks.errors import CapacityError
from sinks.redis.capacity import MemoryInfo, Projection, project_growth, read_memory_info
from sinks.redis.config import RedisSinkConfig
from sinks.redis.node import KeysEvicted, RedisRestarted
from sinks.redis.router import SLOTS, ClusterTopology, KeyRouter, is_cluster, key_slots
from sinks.redis.writer import RedisWritePlan
from sinks.retry import call_with_retries
from stores.redis import TRANSIENT, connect, info_once_loaded, is_transient, node_address


@dataclass
class _Primary:
    """One Redis server to check before the write: the server, or a cluster primary."""

    address: str | None
    client: object
    memory: MemoryInfo | None = None
    capacity: int = 0


@dataclass(frozen=True)
class Preflight:
    """What the driver learned before the write."""

    plan: RedisWritePlan
    baselines: dict[str, MemoryInfo]
    """Per server ("host:port"): memory, run_id and evicted_keys before any write."""
    guard_evictions: bool
    """Whether keys evicted during the write fail it."""
    capacity_text: str
    """The smallest capacity, for messages ("N B", "per primary" in a cluster)."""


def detect_cluster(settings: RedisSettings, config: RedisSinkConfig) -> bool:
    """True for Redis Cluster: as configured, or asked of the server (INFO cluster)."""
    if settings.mode != "auto":
        return settings.mode == "cluster"
    client = connect(config)
    try:
        return call_with_retries(lambda: is_cluster(client), is_transient=is_transient, retries=settings.retries)
    finally:
        client.close()


def preflight(
    settings: RedisSettings,
    config: RedisSinkConfig,
    entity: EntityDef,
    features: tuple[FeatureSpec, ...],
    *,
    entities: int,
    sample: pa.Table,
    as_of_column: str | None,
    report: dict,
    warnings: list[str],
) -> Preflight:
    """Check the servers and plan the write of ``entities`` entities, projecting memory from
    ``sample`` (a few of their rows). Fills ``report`` (the summary's Redis stats: memory,
    capacity, projected growth) and ``warnings``; raises CapacityError with nothing written."""
    cluster = detect_cluster(settings, config)
    topology = ClusterTopology.discover(config) if cluster else None
    primaries = _primaries(settings, config, topology, warnings)
    try:
        note = primaries[0].memory.listpack_note
        if note:  # a least-privilege user: say what the projection assumed
            warnings.append(note)
        keys, rows = _encoded_sample(sample, features, config)
        projections = _project(settings, config, entity, entities, primaries, keys, rows, topology)
        report.update(_capacity_stats(primaries, projections, cluster, warnings))
        for projection in sorted(projections, key=lambda p: -p.fill):
            projection.check()  # raises CapacityError: nothing written
        guard = _check_eviction_policy(settings, entity, primaries, config, warnings)
        # baselines taken before any write: what every writer (whenever it starts) and the
        # check after the last write compare with
        before = {p.address or node_address(config.url): p.memory for p in primaries}
        ceilings = {p.address: int(p.capacity * settings.hard_fill) for p in primaries}
        plan = RedisWritePlan(
            sink=replace(
                config,
                ceiling_bytes=min(ceilings.values()),
                cluster=cluster,
                node_ceilings=tuple((a, c) for a, c in ceilings.items() if a) if cluster else (),
                run_ids=tuple((a, m.run_id) for a, m in before.items()),
                evicted_keys=tuple((a, m.evicted_keys) for a, m in before.items()),
                stop_on_eviction=guard,
            ),
            features=features,
            as_of_column=as_of_column,
        )
        capacity = f"{min(p.capacity for p in primaries):,} B" + (" per primary" if cluster else "")
        return Preflight(plan, before, guard, capacity)
    finally:
        for p in primaries:
            p.client.close()


def _primaries(settings: RedisSettings, config: RedisSinkConfig, topology: ClusterTopology | None, warnings: list[str]) -> list[_Primary]:
    """The servers to check: the one server, or every cluster primary that answers (one that
    does not costs only its own slots: the writers wait for a replica to take them over)."""
    out: list[_Primary] = []
    try:
        for address in list(topology.primaries) if topology else [None]:
            client = connect(config, address)
            try:
                memory = read_memory_info(client, settings.hash_max_listpack_entries, settings.hash_max_listpack_value)
            except TRANSIENT as exc:
                client.close()
                if address is None or len(topology.primaries) == 1:
                    raise
                warnings.append(
                    f"Redis Cluster primary {address} does not answer ({exc}): its {topology.slots_of(address)} slots are written only "
                    f"if a replica takes them over within redis.failover_timeout ({settings.failover_timeout:.0f} s); "
                    "the other primaries are written"
                )
                continue
            out.append(_Primary(address, client, memory, memory.capacity(settings.capacity_bytes)))
    except BaseException:
        for p in out:
            p.client.close()
        raise
    return out


def _encoded_sample(sample: pa.Table, features: tuple[FeatureSpec, ...], config: RedisSinkConfig) -> tuple[list[bytes], list[list]]:
    """Keys and encoded field values of the sample (with the freshness value), to project growth."""
    if not sample.num_rows:
        return [], []
    encoded = encode_batch(sample.combine_chunks().to_batches()[0], list(features))
    columns = [c.to_pylist() for c in encoded.columns]
    ts = str(config.as_of).encode()
    keys = [(config.key_prefix + i).encode() for i in encoded.ids.to_pylist()]
    return keys, [[col[i] for col in columns] + [ts] for i in range(len(keys))]


def _capacity_stats(primaries: list[_Primary], projections: list[Projection], cluster: bool, warnings: list[str]) -> dict:
    """The summary's Redis stats before the write (memory, capacity, projected growth), and the fullest primary's warnings."""
    fullest = max(projections, key=lambda p: p.fill)
    warnings.extend(fullest.warnings())
    stats: dict = {
        "mode": "cluster" if cluster else "standalone",
        "memory_before": sum(p.memory.used for p in primaries),
        "capacity": sum(p.capacity for p in primaries),
        "projected_growth": sum(p.projected_growth for p in projections),
        "predicted_encoding": fullest.predicted_encoding,
    }
    if cluster:
        stats["primaries"] = {
            p.node: {
                "memory_before": p.used_before,
                "capacity": p.capacity,
                "projected_growth": p.projected_growth,
                "projected_fill": round(p.fill, 4),
            }
            for p in projections
        }
    return stats


def _check_eviction_policy(
    settings: RedisSettings, entity: EntityDef, primaries: list[_Primary], config: RedisSinkConfig, warnings: list[str]
) -> bool:
    """Refuse (or, with redis.eviction: warn, report) a server whose maxmemory-policy may
    evict this run's keys. Returns whether evictions during the write must fail it (not
    when every server's policy is volatile-* and the entity type has no TTL)."""
    ttl = bool(entity.ttl_seconds)
    # volatile-* evicts only keys with an expiry: keys of an entity type without a TTL are safe
    concerned = ttl or not all(p.memory.policy.startswith("volatile") for p in primaries)
    evicting = [p for p in primaries if p.memory.evicts(ttl)]
    if not evicting:
        return concerned
    where = ", ".join(f"{p.address or node_address(config.url)} ({p.memory.policy})" for p in evicting)
    text = (
        f"Redis maxmemory-policy may evict {entity.name} keys this run writes "
        f"({'any key' if 'allkeys' in where else 'keys with a TTL'}): {where}; "
        "evicted entities would read as missing. Set maxmemory-policy noeviction (the write then stops at maxmemory instead)"
    )
    if settings.eviction == "refuse":
        raise CapacityError(f"refusing to write: {text}, or redis.eviction: warn to write anyway. Nothing was written.")
    warnings.append(f"{text}. Writing anyway (redis.eviction: warn); the run fails if keys are evicted during it.")
    return True


def check_after_write(config: RedisSinkConfig, baselines: dict[str, MemoryInfo], guard_evictions: bool, report: dict) -> int:
    """After the last write: no server restarted without persistence and none evicted keys
    since the baselines (a writer started after such an event could not tell). Puts
    ``evicted_keys`` in ``report``; returns used_memory of the primaries there are now (a
    failover replaced one)."""
    router = KeyRouter(config, config.cluster)
    try:
        addresses = router.topology.primaries if router.topology else [None]
        used = evicted = 0
        for address in addresses:
            info = info_once_loaded(router.client(address), "memory", "stats", "server")
            used += int(info["used_memory"])
            name = address or node_address(config.url)
            if name not in baselines:
                continue  # a promoted replica: the cluster writer checked its failover
            if str(info["run_id"]) != baselines[name].run_id and not int(info.get("aof_enabled", 0)):
                raise RedisRestarted(
                    f"Redis at {name} restarted during the run without persistence (AOF off): entities written before "
                    "the restart are gone; rerun the date"
                )
            evicted += max(0, int(info.get("evicted_keys", 0)) - baselines[name].evicted_keys)
    finally:
        router.close()
    report["evicted_keys"] = evicted
    if evicted and guard_evictions:
        raise KeysEvicted(
            f"Redis evicted {evicted:,} key(s) during the write (maxmemory-policy): entities this run wrote may be gone; "
            "free memory or raise maxmemory, set maxmemory-policy noeviction, and rerun the date"
        )
    return used


def _project(
    settings: RedisSettings,
    config: RedisSinkConfig,
    entity: EntityDef,
    total: int,
    primaries: list[_Primary],
    keys: list[bytes],
    rows: list[list],
    topology: ClusterTopology | None,
) -> list[Projection]:
    """One projection per primary. In a cluster each gets its share of the entities: by the
    slots it owns or by the sample, whichever is larger (the safe side)."""
    common = dict(
        entity_type=entity.name,
        source_fields=[*config.fields, config.freshness_field],
        ttl=bool(entity.ttl_seconds),
        max_fill=settings.max_fill,
    )
    if topology is None:
        p = primaries[0]
        return [project_growth(p.client, keys=keys, rows=rows, total_entities=total, memory=p.memory, capacity=p.capacity, **common)]
    groups = topology.group(key_slots(keys)) if keys else {}
    out = []
    for p in primaries:
        mine = groups.get(p.address, [])
        share = max(topology.slots_of(p.address) / SLOTS, len(mine) / max(1, len(keys)))
        out.append(
            project_growth(
                p.client,
                keys=[keys[i] for i in mine],
                rows=[rows[i] for i in mine],
                total_entities=math.ceil(total * share),
                memory=p.memory,
                capacity=p.capacity,
                node=p.address,
                **common,
            )
        )
    # a primary with few sampled keys gets at least the whole sample's growth per entity
    sampled = sum(p.sampled for p in out)
    overall = sum(p.growth_per_entity * p.sampled for p in out) / sampled if sampled else 0.0
    for p in out:
        if p.growth_per_entity < overall:
            p.growth_per_entity = overall
            p.projected_growth = max(0, int(overall * p.total_entities))
    return out
