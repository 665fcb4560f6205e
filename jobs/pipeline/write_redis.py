"""Stage 5, write to Redis: the driver-side checks (topology, eviction policy, capacity
projection, baselines), the write from inside the partitions, the check after it."""

from __future__ import annotations

from dataclasses import dataclass, replace
import datetime as dt
from functools import partial
import math
import time

from pyspark.sql import DataFrame

from feature_defs import EntityDef, SourceDef
from jobs import transforms as tf
from jobs.config import RunConf
from jobs.partition_writers import STATS_SCHEMA, RedisWritePlan, sum_partition_stats, write_redis_partition
from jobs.pipeline.context import RunContext
from jobs.progress import progress
from jobs.summary import RunSummary
from serializers import field_id
from serializers.batch import encode_batch
from serializers.keys import as_of_epoch, freshness_field, key_prefix
from sinks.errors import CapacityError, from_wire, raise_first
from sinks.redis_capacity import MemoryInfo, Projection, project_growth, read_memory_info
from sinks.redis_cluster import SLOTS, ClusterTopology, KeyRouter, is_cluster, key_slots, node_url
from sinks.redis_sink import KeysEvicted, RedisRestarted, RedisSinkConfig, RedisTls, connect, node_address
from sinks.redis_sink import is_transient as redis_is_transient
from sinks.retry import call_with_retries


def redis_sink_config(conf: RunConf, source: SourceDef, entity: EntityDef, date: dt.date, ceiling: int | None, url: str | None = None) -> RedisSinkConfig:
    password = conf.redis_password()
    return RedisSinkConfig(
        url=url or conf.redis.url,
        key_prefix=key_prefix(entity.prefix, conf.redis.namespace),
        fields=tuple(field_id(f.name) for f in source.features),
        freshness_field=freshness_field(source.name),
        as_of=as_of_epoch(date),
        ttl_seconds=entity.ttl_seconds,
        ttl_jitter=conf.redis.ttl_jitter,
        chunk_entities=conf.redis.pipeline_entities,
        retries=conf.redis.retries,
        socket_timeout=conf.redis.socket_timeout,
        ceiling_bytes=ceiling,
        recheck_every=conf.redis.recheck_every,
        username=conf.redis.username,
        password=password.get_secret_value() if password else None,
        tls=redis_tls(conf),
        wait_replicas=conf.redis.wait_replicas,
        wait_timeout_ms=conf.redis.wait_timeout_ms,
        failover_timeout=conf.redis.failover_timeout,
    )


def redis_tls(conf: RunConf) -> RedisTls:
    """The redis.tls_* files, relative ones under the project root (executors may run elsewhere)."""
    r = conf.redis
    ca, cert, key = (str(conf.path(value)) if value else None for value in (r.tls_ca_file, r.tls_cert_file, r.tls_key_file))
    return RedisTls(ca_file=ca, cert_file=cert, key_file=key)


@dataclass
class _Primary:
    """One Redis server to check before the write: the server, or a cluster primary."""

    address: str | None
    client: object
    memory: MemoryInfo | None
    capacity: int


def is_redis_cluster(conf: RunConf, sink_conf: RedisSinkConfig) -> bool:
    """True for Redis Cluster: as configured, or asked of the server (INFO cluster)."""
    if conf.redis.mode != "auto":
        return conf.redis.mode == "cluster"
    client = connect(sink_conf.url, password=sink_conf.password, username=sink_conf.username, tls=sink_conf.tls)
    try:
        return call_with_retries(lambda: is_cluster(client), is_transient=redis_is_transient, retries=conf.redis.retries)
    finally:
        client.close()


def _redis_primaries(conf: RunConf, sink_conf: RedisSinkConfig, topology: ClusterTopology | None) -> list[_Primary]:
    options = dict(password=sink_conf.password, username=sink_conf.username, tls=sink_conf.tls)
    addresses: list[str | None] = list(topology.primaries) if topology else [None]
    out: list[_Primary] = []
    try:
        for address in addresses:
            client = connect(node_url(sink_conf.url, address) if address else sink_conf.url, **options)
            out.append(_Primary(address, client, None, 0))
            out[-1].memory = read_memory_info(client, conf.redis.hash_max_listpack_entries, conf.redis.hash_max_listpack_value)
            out[-1].capacity = out[-1].memory.capacity(conf.redis.capacity_bytes)
    except BaseException:
        for p in out:
            p.client.close()
        raise
    return out


def write_redis(ctx: RunContext, good: DataFrame, summary: RunSummary) -> dict:
    """Check the servers (capacity, eviction policy), take the baselines, write from inside
    the partitions, then check the servers again. Returns the summary's Redis stats."""
    conf, source, entity = ctx.conf, ctx.source, ctx.entity
    sink_conf = redis_sink_config(conf, source, entity, ctx.date, None, ctx.redis_url)
    cluster = is_redis_cluster(conf, sink_conf)
    topology = ClusterTopology.discover(sink_conf.url, password=sink_conf.password, username=sink_conf.username, tls=sink_conf.tls) if cluster else None
    primaries = _redis_primaries(conf, sink_conf, topology)
    try:
        note = primaries[0].memory.listpack_note
        if note:  # a least-privilege user: say what the projection assumed
            summary.warnings.append(note)
        keys, rows = _encoded_sample(ctx, good, sink_conf, summary.entities)
        projections = _project(conf, sink_conf, entity, summary.entities, primaries, keys, rows, topology)
        summary.sinks["redis"] = stats = _capacity_stats(primaries, projections, cluster, summary)
        for projection in sorted(projections, key=lambda p: -p.fill):
            projection.check()  # raises CapacityError: nothing written
        guard_evictions = _check_eviction_policy(conf, entity, primaries, sink_conf, summary)
        # baselines taken before any write: what every writer (whenever it starts) and the
        # check after the last write compare with
        before = {p.address or node_address(sink_conf.url): p.memory for p in primaries}
        plan = _write_plan(ctx, good, primaries, before, cluster, guard_evictions)
        start = time.perf_counter()
        with progress(ctx.spark, f"write {source.name} to redis"):
            parts = good.mapInArrow(partial(write_redis_partition, plan), STATS_SCHEMA).collect()
        _sum_writers(ctx, parts, time.perf_counter() - start, stats, summary)
        stats["memory_after"] = _check_after_write(sink_conf, cluster, before, guard_evictions, stats)
        stopped = [p["stopped"] for p in parts if p["stopped"]]
        if stopped:
            capacity = f"{min(p.capacity for p in primaries):,} B" + (" per primary" if cluster else "")
            raise CapacityError(
                f"Redis write stopped at the memory ceiling (ours: {conf.redis.hard_fill:.0%} of {capacity}, or Redis's maxmemory): "
                f"{stats['entities']:,} of {summary.entities:,} entities ({stats['values_set']:,} values) were written "
                f"before {len(stopped)} writer(s) stopped; first: {stopped[0]}"
            )
        return stats
    finally:
        for p in primaries:
            p.client.close()


def _encoded_sample(ctx: RunContext, good: DataFrame, sink_conf: RedisSinkConfig, entities: int) -> tuple[list[bytes], list[list]]:
    """Keys and encoded field values of a random sample (small: it comes to the driver), to project growth."""
    sample_entities = ctx.conf.redis.sample_entities
    fraction = min(1.0, 2.0 * sample_entities / max(1, entities))
    sample = good.sample(fraction=fraction, seed=17).limit(sample_entities).toArrow()
    if not sample.num_rows:
        return [], []
    encoded = encode_batch(sample.combine_chunks().to_batches()[0], list(tf.feature_specs(ctx.source)))
    columns = [c.to_pylist() for c in encoded.columns]
    ts = str(sink_conf.as_of).encode()
    keys = [(sink_conf.key_prefix + i).encode() for i in encoded.ids.to_pylist()]
    return keys, [[col[i] for col in columns] + [ts] for i in range(len(keys))]


def _capacity_stats(primaries: list[_Primary], projections: list[Projection], cluster: bool, summary: RunSummary) -> dict:
    """The summary's Redis stats before the write (memory, capacity, projected growth), and the fullest primary's warnings."""
    fullest = max(projections, key=lambda p: p.fill)
    summary.warnings.extend(fullest.warnings())
    stats: dict = {
        "mode": "cluster" if cluster else "standalone",
        "memory_before": sum(p.memory.used for p in primaries),
        "capacity": sum(p.capacity for p in primaries),
        "projected_growth": sum(p.projected_growth for p in projections),
        "predicted_encoding": fullest.predicted_encoding,
    }
    if cluster:
        stats["primaries"] = {
            p.node: {"memory_before": p.used_before, "capacity": p.capacity, "projected_growth": p.projected_growth, "projected_fill": round(p.fill, 4)}
            for p in projections
        }
    return stats


def _write_plan(ctx: RunContext, good: DataFrame, primaries: list[_Primary], before: dict[str, MemoryInfo], cluster: bool, guard_evictions: bool) -> RedisWritePlan:
    """What each writer gets (pickled): its sink config with the ceilings and the driver's baselines."""
    conf = ctx.conf
    ceilings = {p.address: int(p.capacity * conf.redis.hard_fill) for p in primaries}
    return RedisWritePlan(
        sink=replace(
            redis_sink_config(conf, ctx.source, ctx.entity, ctx.date, min(ceilings.values()), ctx.redis_url),
            cluster=cluster,
            node_ceilings=tuple((a, c) for a, c in ceilings.items() if a) if cluster else (),
            run_ids=tuple((a, m.run_id) for a, m in before.items()),
            evicted_keys=tuple((a, m.evicted_keys) for a, m in before.items()),
            stop_on_eviction=guard_evictions,
        ),
        features=tf.feature_specs(ctx.source),
        as_of_column=tf.AS_OF if tf.AS_OF in good.columns else None,
    )


def _sum_writers(ctx: RunContext, parts: list, seconds: float, stats: dict, summary: RunSummary) -> None:
    """Add up the writers' stats; fail with their errors, rebuilt as their classes."""
    keys = ("entities", "skipped_newer", "values_set", "values_deleted", "non_finite", "bytes_sent", "round_trips", "retries", "redirects")
    sum_partition_stats(stats, parts, keys, seconds, rate=("values_per_s", "values_set"))
    if stats["skipped_newer"]:
        summary.warnings.append(
            f"redis: {stats['skipped_newer']:,} entities already hold a newer snapshot of {ctx.source.name} than {ctx.date} "
            "and were left as they are"
        )
    errors = [from_wire(p["error_kind"], p["error"]) for p in parts if p["error"]]
    raise_first(
        errors,
        f"Redis write failed in {len(errors)} of {len(parts)} writer(s) after {stats['entities']:,} of "
        f"{summary.entities:,} entities were written (a rerun of the date writes them all again)",
    )


def _check_eviction_policy(conf: RunConf, entity: EntityDef, primaries: list[_Primary], sink_conf: RedisSinkConfig, summary: RunSummary) -> bool:
    """Refuse (or, with redis.eviction: warn, report) a server whose maxmemory-policy may
    evict this run's keys. Returns whether evictions during the write must fail it (not
    when every server's policy is volatile-* and the entity type has no TTL)."""
    ttl = bool(entity.ttl_seconds)
    # volatile-* evicts only keys with an expiry: keys of an entity type without a TTL are safe
    concerned = ttl or not all(p.memory.policy.startswith("volatile") for p in primaries)
    evicting = [p for p in primaries if p.memory.evicts(ttl)]
    if not evicting:
        return concerned
    where = ", ".join(f"{p.address or node_address(sink_conf.url)} ({p.memory.policy})" for p in evicting)
    text = (
        f"Redis maxmemory-policy may evict {entity.name} keys this run writes ({'any key' if 'allkeys' in where else 'keys with a TTL'}): {where}; "
        "evicted entities would read as missing. Set maxmemory-policy noeviction (the write then stops at maxmemory instead)"
    )
    if conf.redis.eviction == "refuse":
        raise CapacityError(f"refusing to write: {text}, or redis.eviction: warn to write anyway. Nothing was written.")
    summary.warnings.append(f"{text}. Writing anyway (redis.eviction: warn); the run fails if keys are evicted during it.")
    return True


def _check_after_write(sink_conf: RedisSinkConfig, cluster: bool, before: dict[str, MemoryInfo], guard_evictions: bool, stats: dict) -> int:
    """After the last write: no server restarted without persistence and none evicted keys
    since the baselines (a writer started after such an event could not tell). Returns
    used_memory of the primaries there are now (a failover replaced one)."""
    router = KeyRouter(sink_conf.url, cluster, password=sink_conf.password, username=sink_conf.username, tls=sink_conf.tls)
    try:
        addresses = router.topology.primaries if router.topology else [None]
        used = evicted = 0
        for address in addresses:
            info = router.client(address).info("memory", "stats", "server", "persistence")
            used += int(info["used_memory"])
            name = address or node_address(sink_conf.url)
            if name not in before:
                continue  # a promoted replica: the cluster writer checked its failover
            if str(info["run_id"]) != before[name].run_id and not int(info.get("aof_enabled", 0)):
                raise RedisRestarted(
                    f"Redis at {name} restarted during the run without persistence (AOF off): entities written before "
                    "the restart are gone; rerun the date"
                )
            evicted += max(0, int(info.get("evicted_keys", 0)) - before[name].evicted_keys)
    finally:
        router.close()
    stats["evicted_keys"] = evicted
    if evicted and guard_evictions:
        raise KeysEvicted(
            f"Redis evicted {evicted:,} key(s) during the write (maxmemory-policy): entities this run wrote may be gone; "
            "free memory or raise maxmemory, set maxmemory-policy noeviction, and rerun the date"
        )
    return used


def _project(conf: RunConf, sink_conf: RedisSinkConfig, entity: EntityDef, total: int, primaries: list[_Primary], keys: list[bytes], rows: list[list], topology: ClusterTopology | None) -> list[Projection]:
    """One projection per primary. In a cluster each gets its share of the entities: by the
    slots it owns or by the sample, whichever is larger (the safe side)."""
    common = dict(entity_type=entity.name, source_fields=[*sink_conf.fields, sink_conf.freshness_field], ttl=bool(entity.ttl_seconds), max_fill=conf.redis.max_fill)
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
                p.client, keys=[keys[i] for i in mine], rows=[rows[i] for i in mine], total_entities=math.ceil(total * share),
                memory=p.memory, capacity=p.capacity, node=p.address, **common,
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
