"""Redis sink: one hash per entity, pipelined HSET/HDEL/EXPIRE in bounded chunks.

The commands are built column-wise as RESP bytes (:mod:`serializers.resp`) and written
to the socket of a connection that redis-py made (so TLS, AUTH and SELECT are its
business); replies are parsed with hiredis. redis-py itself runs the control commands.

Per entity and source (README "Online format"): HSET every non-null feature and the
source's freshness field, HDEL the source's null features, EXPIRE with jitter. Fields
of other sources in the same hash are never touched. Every command can be repeated, so
a chunk that failed on a dropped connection is simply sent again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hiredis
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
import xxhash
from redis.backoff import NoBackoff
from redis.retry import Retry

from serializers.batch import EncodedBatch
from serializers.resp import EntityCommands, entity_commands
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
        self._conn: redis.Connection | None = None
        """The pipeline's connection: made by redis-py, written to with RESP built here."""
        self._reader: hiredis.Reader | None = None

    def open(self) -> None:
        c = self.config
        self.client = connect(c.url, password=c.password, username=c.username, socket_timeout=c.socket_timeout)
        self.check_ceiling()

    def close(self) -> None:
        if self.client is not None:
            self._drop_data()
            self.client.close()
            self.client = None

    def __enter__(self) -> RedisSink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def used_memory(self) -> int:
        return int(self.client.info("memory")["used_memory"])

    def _over_ceiling(self) -> int | None:
        """used_memory when it is past the hard ceiling, else None."""
        ceiling = self.config.ceiling_bytes
        if ceiling is None:
            return None
        used = self.used_memory()
        return used if used > ceiling else None

    def check_ceiling(self) -> None:
        used = self._over_ceiling()
        if used is not None:
            raise CeilingReached(used, self.config.ceiling_bytes, self.stats)

    def write_batch(self, batch: EncodedBatch, as_of: pa.Array | None = None) -> WriteStats:
        """Write one encoded batch, pipelined in chunks.

        Returns what this batch wrote (entities, values set and deleted, non-finite values);
        ``.stats`` sums those and the connection figures (bytes, round trips, retries).
        ``as_of``: a freshness value per row (range runs) instead of the config's one."""
        c = self.config
        keys = pc.binary_join_element_wise(self._prefix, batch.ids.cast(pa.binary()), b"")
        ttl = None
        if c.ttl_seconds:
            ttl = np.fromiter((ttl_with_jitter(k, c.ttl_seconds, c.ttl_jitter) for k in keys.to_pylist()), np.int64, len(keys))
        freshness = str(c.as_of).encode() if as_of is None else as_of
        commands = entity_commands(keys, batch.columns, c.fields, c.freshness_field, freshness, ttl)
        bounds = [(start, min(len(commands), start + c.chunk_entities)) for start in range(0, len(commands), c.chunk_entities)]
        batch_stats = WriteStats(non_finite=batch.non_finite)
        self.stats.non_finite += batch.non_finite
        self._pipeline(commands, keys, bounds, batch_stats)
        return batch_stats

    def _pipeline(self, commands: EntityCommands, keys: pa.Array, bounds: list[tuple[int, int]], batch_stats: WriteStats) -> None:
        """Send the chunks with one in flight: the server runs chunk k while chunk k+1 is sent.

        After a dropped connection, every chunk not yet acknowledged is sent again on a new
        connection (the commands can be repeated). The retry budget is per stretch without
        progress: a resend that gets further starts a new one."""
        done = {"next": 0}  # first chunk whose replies have not been read

        def acknowledge(index: int, in_flight: int | None) -> None:
            self._acknowledge(commands, keys, bounds[index], batch_stats)
            done["next"] = index + 1
            self._chunks += 1
            if self._chunks % self.config.recheck_every == 0 and (used := self._over_ceiling()) is not None:
                if in_flight is not None:
                    # that chunk is already on its way: count it, so the report says what was written
                    self._acknowledge(commands, keys, bounds[in_flight], batch_stats)
                raise CeilingReached(used, self.config.ceiling_bytes, self.stats)

        def resume() -> None:
            if self._conn is None:
                self._connect_data()
            in_flight: int | None = None
            for k in range(done["next"], len(bounds)):
                self._send(commands.wire_bytes(*bounds[k]))
                if in_flight is not None:
                    acknowledge(in_flight, k)
                in_flight = k
            if in_flight is not None:
                acknowledge(in_flight, None)

        attempts = {"n": 0}

        def on_retry(attempt: int, exc: BaseException) -> None:
            attempts["n"] = attempt
            self.stats.retries += 1
            self._drop_data()

        while done["next"] < len(bounds):
            reached = done["next"]
            try:
                call_with_retries(resume, is_transient=lambda e: isinstance(e, _TRANSIENT), retries=self.config.retries, on_retry=on_retry)
            except _TRANSIENT as exc:
                self._drop_data()
                if done["next"] > reached:
                    continue  # the resends got further: a new budget for the rest
                start, stop = bounds[done["next"]]
                raise TransientSinkError(
                    f"Redis connection failed {attempts['n'] + 1} times on a chunk of {stop - start} entities "
                    f"(first key {keys[start].as_py()!r}): {exc}"
                ) from exc

    def _connect_data(self) -> None:
        # redis-py makes the connection (TLS, AUTH, SELECT); the pipeline then uses its socket.
        conn = self.client.connection_pool.get_connection()
        conn.connect()
        self._conn = conn
        self._reader = hiredis.Reader()

    def _drop_data(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()
            self.client.connection_pool.release(self._conn)
            self._conn = None

    def _send(self, data: memoryview) -> None:
        try:
            self._conn._sock.sendall(data)
        except OSError as exc:
            raise redis.ConnectionError(f"sending to Redis failed: {exc}") from exc
        self.stats.bytes_sent += len(data)
        self.stats.round_trips += 1

    def _replies(self, count: int) -> list:
        out = []
        reader, sock = self._reader, self._conn._sock
        while len(out) < count:
            reply = reader.gets()
            if reply is False:
                try:
                    data = sock.recv(1 << 16)
                except OSError as exc:
                    raise redis.ConnectionError(f"reading from Redis failed: {exc}") from exc
                if not data:
                    raise redis.ConnectionError("Redis closed the connection")
                reader.feed(data)
                continue
            out.append(reply)
        return out

    def _acknowledge(self, commands: EntityCommands, keys: pa.Array, bound: tuple[int, int], batch_stats: WriteStats) -> None:
        """Read one chunk's replies; count what it did; stop on the first refused command."""
        start, stop = bound
        per_entity = commands.replies[start:stop]
        replies = self._replies(int(per_entity.sum()))
        first = np.zeros(stop - start, dtype=np.int64)  # index of each entity's HSET reply
        np.cumsum(per_entity[:-1], out=first[1:])
        for index, reply in enumerate(replies):
            if isinstance(reply, hiredis.ReplyError):
                entity = start + int(np.searchsorted(first, index, side="right")) - 1
                if str(reply).startswith("OOM"):
                    used = self.used_memory()
                    raise CeilingReached(used, self.config.ceiling_bytes or used, self.stats) from reply
                raise TerminalSinkError(f"Redis refused a command for key {keys[entity].as_py()!r}: {reply}") from reply
        deleted = sum(replies[i + 1] for i in first[commands.deletes[start:stop]])
        chunk = WriteStats(entities=stop - start, values_set=int(commands.values_set[start:stop].sum()), values_deleted=int(deleted))
        batch_stats.add(chunk)
        for name in ("entities", "values_set", "values_deleted"):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(chunk, name))
