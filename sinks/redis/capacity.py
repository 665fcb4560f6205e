"""Will this write fit? Project Redis memory growth from an encoded sample, before writing.

The estimate follows Redis 7's hash encodings: a hash stays a compact listpack while it
has at most ``hash-max-listpack-entries`` fields and every value is at most
``hash-max-listpack-value`` bytes; one larger value converts the whole hash to a
hashtable (about 4x the memory). Sampled entities that already exist are read
(MEMORY USAGE, OBJECT ENCODING, HMGET of this source's fields) so a nightly refresh of
existing keys projects ~0 growth instead of the full data size.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import redis

from sinks.errors import CapacityError

log = logging.getLogger(__name__)

# Approximate per-item costs in bytes (Redis 7, jemalloc, 64-bit), measured orders of magnitude.
KEY_OVERHEAD = 72  # main dict entry + robj + key sds + listpack header
EXPIRE_OVERHEAD = 32  # expires dict entry
HASHTABLE_FIELD_OVERHEAD = 48  # dictEntry + two sds headers + bucket, rounded by the allocator
HASHTABLE_CONVERSION_FACTOR = 4.0
FIELD_ID_ENTRY = 6  # a 4-byte field id in a listpack: header + 4 bytes + backlen


@dataclass(frozen=True)
class MemoryInfo:
    used: int
    maxmemory: int
    listpack_entries: int
    listpack_value: int
    listpack_note: str | None = None
    """Set when the server's hash-max-listpack-* could not be read: which values were assumed."""
    policy: str = "noeviction"
    """maxmemory-policy: what Redis does at maxmemory (evict keys, or refuse writes)."""
    evicted_keys: int = 0
    run_id: str = ""
    """Changes when the server restarts: taken before any write, compared after."""

    def evicts(self, ttl: bool) -> bool:
        """Whether the policy may evict this run's keys: any key (allkeys-*), or keys with an
        expiry (volatile-*) when the entity type has a TTL. No maxmemory: nothing is evicted."""
        if not self.maxmemory or self.policy == "noeviction":
            return False
        return self.policy.startswith("allkeys") or ttl

    def capacity(self, configured: int | None) -> int:
        if self.maxmemory:
            return self.maxmemory
        if configured:
            return configured
        raise CapacityError(
            "Redis has no maxmemory set and no redis.capacity_bytes is configured: cannot check whether the write fits (set one of them)"
        )


def read_memory_info(client: redis.Redis, entries: int | None = None, value: int | None = None) -> MemoryInfo:
    """INFO memory and the server's hash-max-listpack-* limits.

    A least-privilege user may not run CONFIG GET (it would also read secrets such as
    requirepass): the limits then come from ``entries``/``value`` (the config's copy of the
    server's settings), else Redis's defaults 512/64, and the note says which were used."""
    info = client.info("memory", "stats", "server")
    note = None
    try:
        conf = client.config_get("hash-max-listpack-*")
        entries = int(conf.get(b"hash-max-listpack-entries", conf.get("hash-max-listpack-entries", 512)))
        value = int(conf.get(b"hash-max-listpack-value", conf.get("hash-max-listpack-value", 64)))
    except redis.ResponseError as exc:  # NOPERM for a least-privilege user
        configured = entries is not None or value is not None
        entries, value = entries or 512, value or 64
        where = "from the config" if configured else "Redis's defaults: set redis.hash_max_listpack_entries/_value to the server's values"
        note = f"CONFIG GET hash-max-listpack-* refused ({exc}); the capacity check assumed entries {entries}, value {value} ({where})"
        log.warning("%s", note)
    return MemoryInfo(
        int(info["used_memory"]),
        int(info.get("maxmemory", 0)),
        entries,
        value,
        note,
        policy=str(info.get("maxmemory_policy", "noeviction")),
        evicted_keys=int(info.get("evicted_keys", 0)),
        run_id=str(info.get("run_id", "")),
    )


def _listpack_entry(value: bytes) -> int:
    """Bytes of one listpack entry: integers are stored compactly, strings with a header."""
    if value.isdigit() or (value[:1] == b"-" and value[1:].isdigit()):
        if len(value) <= 19 and not (len(value) > 1 and value.lstrip(b"-").startswith(b"0")):
            n = abs(int(value))
            return 2 if n < 128 else 3 if n < 4096 else 4 if n < 32768 else 5 if n < 2**23 else 6 if n < 2**31 else 10
    size = len(value)
    header = 1 if size < 64 else 2 if size < 4096 else 5
    total = header + size
    return total + (1 if total < 128 else 2 if total < 16384 else 3)


def field_cost(value: bytes, hashtable: bool) -> int:
    """Memory of one (4-byte field id, value) pair in the given encoding."""
    if hashtable:
        return HASHTABLE_FIELD_OVERHEAD + _round8(len(value) + 4) + 16
    return FIELD_ID_ENTRY + _listpack_entry(value)


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


@dataclass
class Projection:
    entity_type: str
    sampled: int
    existing: int
    total_entities: int
    growth_per_entity: float
    projected_growth: int
    used_before: int
    capacity: int
    max_fill: float
    hashtable_share: float
    """Share of sampled entities whose hash is predicted to be a hashtable after the write."""
    max_value_bytes: int
    listpack_value_limit: int
    listpack_entries_limit: int
    node: str | None = None
    """Redis Cluster: the primary this projection is for (its share of the entities)."""

    @property
    def fill(self) -> float:
        """Projected share of capacity used after the write."""
        return self.projected_used / self.capacity

    @property
    def projected_used(self) -> int:
        return self.used_before + self.projected_growth

    @property
    def predicted_encoding(self) -> str:
        if self.hashtable_share == 0:
            return "listpack"
        if self.hashtable_share == 1:
            return "hashtable"
        return f"mixed ({self.hashtable_share:.0%} hashtable)"

    def warnings(self) -> list[str]:
        out = []
        if self.max_value_bytes > self.listpack_value_limit:
            out.append(
                f"{self.entity_type}: values up to {self.max_value_bytes} B exceed hash-max-listpack-value "
                f"{self.listpack_value_limit}: those hashes use the hashtable encoding (~4x memory); "
                f"raise hash-max-listpack-value to at least {self.max_value_bytes}"
            )
        return out

    def check(self) -> None:
        limit = int(self.capacity * self.max_fill)
        if self.projected_used > limit:
            what = f"{self.total_entities:,} {self.entity_type} entities: Redis"
            if self.node:  # the fullest primary decides, whatever room the others have
                what = f"{self.entity_type} entities: Redis Cluster primary {self.node}, which gets ~{self.total_entities:,} of them,"
            raise CapacityError(
                f"refusing to write {what} uses {self.used_before:,} B, the write is projected to add {self.projected_growth:,} B "
                f"(~{self.growth_per_entity:,.0f} B per entity from a sample of {self.sampled}), "
                f"{self.projected_used:,} B in all, over {self.max_fill:.0%} of capacity {self.capacity:,} B "
                f"({limit:,} B). Nothing was written."
            )

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(projected_used=self.projected_used, predicted_encoding=self.predicted_encoding)
        return d


def project_growth(
    client: redis.Redis,
    *,
    entity_type: str,
    keys: list[bytes],
    rows: list[list[bytes | None]],
    source_fields: list[bytes],
    ttl: bool,
    total_entities: int,
    memory: MemoryInfo,
    capacity: int,
    max_fill: float,
    node: str | None = None,
) -> Projection:
    """Project growth from sampled entities.

    ``rows[i]`` are key i's encoded values (None = not written) for ``source_fields``,
    which include the freshness field last.
    """
    existing = 0
    growth = 0.0
    hashtables = 0
    max_value = 0
    state = _existing_state(client, keys, source_fields)
    for values, (usage, encoding, hlen, old_values) in zip(rows, state):
        new = [v for v in values if v is not None]
        max_value = max([max_value, *map(len, new)])
        old = [v for v in old_values if v is not None]
        fields_after = (hlen or 0) - len(old) + len(new)
        becomes_hashtable = (
            encoding == b"hashtable" or any(len(v) > memory.listpack_value for v in new) or fields_after > memory.listpack_entries
        )
        hashtables += becomes_hashtable
        g = sum(field_cost(v, becomes_hashtable) for v in new) - sum(field_cost(v, becomes_hashtable) for v in old)
        if usage is None:
            g += KEY_OVERHEAD + (EXPIRE_OVERHEAD if ttl else 0)
        else:
            existing += 1
            if becomes_hashtable and encoding != b"hashtable":
                g += usage * (HASHTABLE_CONVERSION_FACTOR - 1)
        growth += g
    sampled = max(1, len(keys))
    per_entity = growth / sampled
    return Projection(
        entity_type=entity_type,
        sampled=len(keys),
        existing=existing,
        total_entities=total_entities,
        growth_per_entity=per_entity,
        projected_growth=max(0, int(per_entity * total_entities)),
        used_before=memory.used,
        capacity=capacity,
        max_fill=max_fill,
        hashtable_share=hashtables / sampled if keys else 0.0,
        max_value_bytes=max_value,
        listpack_value_limit=memory.listpack_value,
        listpack_entries_limit=memory.listpack_entries,
        node=node,
    )


def _existing_state(client: redis.Redis, keys: list[bytes], source_fields: list[bytes]) -> list[tuple]:
    """Per key: (MEMORY USAGE or None, OBJECT ENCODING, HLEN, HMGET of source fields)."""
    if not keys:
        return []
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.execute_command("MEMORY", "USAGE", key)
        pipe.execute_command("OBJECT", "ENCODING", key)
        pipe.execute_command("HLEN", key)
        pipe.execute_command("HMGET", key, *source_fields)
    replies = pipe.execute(raise_on_error=False)
    out = []
    for i in range(len(keys)):
        usage, encoding, hlen, values = replies[4 * i : 4 * i + 4]
        if isinstance(usage, Exception) or isinstance(encoding, Exception):
            # MEMORY/OBJECT refused (ACL): assume absent, which over-estimates growth (safe side)
            usage, encoding = None, None
        out.append((usage, encoding, 0 if isinstance(hlen, Exception) else hlen, [] if isinstance(values, Exception) else values))
    return out
