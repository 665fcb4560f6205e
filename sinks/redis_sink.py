"""Redis sink: one hash per entity, pipelined HSET/HDEL/EXPIRE in bounded chunks.

Per entity and source (README "Online format"): HSET every non-null feature and the
source's freshness field, HDEL the source's null features, EXPIRE with jitter. Fields
of other sources in the same hash are never touched. Every command can be repeated, so
a chunk that failed on a dropped connection is simply sent again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import redis
import xxhash
from redis.backoff import NoBackoff
from redis.retry import Retry

from serializers.batch import EncodedBatch
from sinks.base import WriteStats
from sinks.errors import CapacityError, TerminalSinkError, TransientSinkError
from sinks.retry import call_with_retries

_TRANSIENT = (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError)


@dataclass(frozen=True)
class RedisSinkConfig:
    url: str
    """redis:// or rediss:// URL (no password in it: see password)."""
    key_prefix: str
    """'<namespace>:<prefix>:' or '<prefix>:' put in front of every entity id."""
    fields: tuple[bytes, ...]
    """Field ids of the source's features, in column order."""
    freshness_field: bytes
    """Field id of this source's freshness field."""
    as_of: int
    """Snapshot as-of time, UTC epoch seconds (the freshness value)."""
    ttl_seconds: int | None = None
    ttl_jitter: float = 0.1
    """EXPIRE gets ttl + up to this fraction of ttl, fixed per key (reruns set the same)."""
    chunk_entities: int = 500
    """Entities per pipeline round trip."""
    retries: int = 3
    socket_timeout: float = 30.0
    ceiling_bytes: int | None = None
    """Stop when used_memory passes this (hard ceiling)."""
    recheck_every: int = 20
    """Read used_memory every N chunks."""
    username: str | None = None
    password: str | None = field(default=None, repr=False)


class CeilingReached(CapacityError):
    def __init__(self, used: int, ceiling: int, stats: WriteStats):
        self.used, self.ceiling, self.stats = used, ceiling, stats
        super().__init__(
            f"Redis used_memory {used:,} B passed the hard ceiling {ceiling:,} B; this writer stopped after "
            f"{stats.entities:,} entities ({stats.values_set:,} values)"
        )


def connect(url: str, *, password: str | None = None, username: str | None = None, socket_timeout: float = 30.0) -> redis.Redis:
    # Retries happen in one place (sinks.retry), so redis-py's own retry is off.
    return redis.Redis.from_url(
        url,
        password=password,
        username=username,
        socket_timeout=socket_timeout,
        socket_connect_timeout=min(socket_timeout, 10.0),
        retry=Retry(NoBackoff(), 0),
        decode_responses=False,
    )


def ttl_with_jitter(key: bytes, ttl: int, jitter: float) -> int:
    """ttl plus a per-key share of up to ``jitter``*ttl: spread out, yet repeatable."""
    span = int(ttl * jitter)
    return ttl + (xxhash.xxh32_intdigest(key) % (span + 1) if span else 0)


class RedisSink:
    def __init__(self, config: RedisSinkConfig):
        self.config = config
        self.client: redis.Redis | None = None
        self.stats = WriteStats()
        self._chunks = 0
        self._prefix = config.key_prefix.encode("utf-8")

    def open(self) -> None:
        c = self.config
        self.client = connect(c.url, password=c.password, username=c.username, socket_timeout=c.socket_timeout)
        self.check_ceiling()

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None

    def __enter__(self) -> RedisSink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def check_ceiling(self) -> None:
        ceiling = self.config.ceiling_bytes
        if ceiling is None:
            return
        used = self.used_memory()
        if used > ceiling:
            raise CeilingReached(used, ceiling, self.stats)

    def write_batch(self, batch: EncodedBatch, as_of: list[int] | None = None) -> WriteStats:
        """Write one encoded batch in chunks; returns this batch's stats (also summed in .stats).

        ``as_of``: a freshness value per row (range runs) instead of the config's one."""
        batch_stats = WriteStats(non_finite=batch.non_finite, bytes_sent=int(batch.value_bytes.sum()))
        self.stats.add(batch_stats)
        values = [col.to_pylist() for col in batch.columns]
        n = len(batch)
        step = self.config.chunk_entities
        for start in range(0, n, step):
            commands, chunk = self._commands(batch.ids, values, range(start, min(n, start + step)), as_of)
            chunk.values_deleted = self._send(commands)
            batch_stats.add(chunk)
            self.stats.add(chunk)
            self._chunks += 1
            if self._chunks % self.config.recheck_every == 0:
                self.check_ceiling()
        return batch_stats

    def _commands(self, ids: list[str], values: list[list], rows: range, as_of: list[int] | None = None) -> tuple[list[tuple], WriteStats]:
        c = self.config
        fields = c.fields
        ts_value = str(c.as_of).encode()
        stats = WriteStats()
        commands: list[tuple] = []
        overhead = 0
        for i in rows:
            if as_of is not None:
                ts_value = str(as_of[i]).encode()
            key = self._prefix + ids[i].encode("utf-8")
            hset: list[bytes] = []
            hdel: list[bytes] = []
            for fid, col in zip(fields, values):
                v = col[i]
                if v is None:
                    hdel.append(fid)
                else:
                    hset.append(fid)
                    hset.append(v)
            stats.values_set += len(hset) // 2
            hset.append(c.freshness_field)
            hset.append(ts_value)
            commands.append(("HSET", key, *hset))
            key_bytes = len(key) + len(str(len(key))) + 5
            # RESP framing of everything but the feature values (counted by the encoder)
            overhead += len(str(len(hset) + 2)) + 3 + 10 + key_bytes + 10 * (len(hset) // 2) + len(ts_value) + len(str(len(ts_value))) + 5
            if hdel:
                commands.append(("HDEL", key, *hdel))
                overhead += len(str(len(hdel) + 2)) + 3 + 10 + key_bytes + 10 * len(hdel)
            if c.ttl_seconds:
                ttl = str(ttl_with_jitter(key, c.ttl_seconds, c.ttl_jitter)).encode()
                commands.append(("EXPIRE", key, ttl))
                overhead += 4 + 12 + key_bytes + len(ttl) + len(str(len(ttl))) + 5
            stats.entities += 1
        stats.bytes_sent = overhead
        return commands, stats

    def _send(self, commands: list[tuple]) -> int:
        """Send one chunk; returns fields removed by its HDELs."""
        attempts = {"n": 0}

        def once() -> list:
            # a fresh pipeline per attempt: a retry re-sends the whole chunk
            pipe = self.client.pipeline(transaction=False)
            for cmd in commands:
                pipe.execute_command(*cmd)
            return pipe.execute(raise_on_error=False)

        def on_retry(attempt: int, exc: BaseException) -> None:
            attempts["n"] = attempt

        try:
            replies = call_with_retries(
                once, is_transient=lambda e: isinstance(e, _TRANSIENT), retries=self.config.retries, on_retry=on_retry
            )
        except _TRANSIENT as exc:
            raise TransientSinkError(
                f"Redis connection failed {attempts['n'] + 1} times on a chunk of {len(commands)} commands "
                f"(first key {commands[0][1]!r}): {exc}"
            ) from exc
        self.stats.retries += attempts["n"]
        self.stats.round_trips += 1 + attempts["n"]
        deleted = 0
        for index, (cmd, reply) in enumerate(zip(commands, replies)):
            if isinstance(reply, Exception):
                text = str(reply)
                if text.startswith("OOM"):
                    used = self.used_memory()
                    raise CeilingReached(used, self.config.ceiling_bytes or used, self.stats) from reply
                raise TerminalSinkError(f"Redis refused command #{index} of the chunk ({cmd[0]} {cmd[1]!r}): {text}") from reply
            if cmd[0] == "HDEL":
                deleted += int(reply)
        return deleted
