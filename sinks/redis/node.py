"""One Redis server's writer: one hash per entity, a pipelined conditional write per entity, in bounded chunks.

The commands are built column-wise as RESP bytes (:mod:`serializers.resp`) and written
to the socket of a connection that redis-py made (so TLS, AUTH and SELECT are its
business); replies are parsed with hiredis. redis-py itself runs the control commands.

Per entity and source (serializers/FORMAT.md), one server-side script call: unless the
hash already holds a newer snapshot of this source, HSET every non-null feature and the
source's freshness field, HDEL the source's null features, EXPIRE with jitter (PERSIST
without a TTL). Fields of other sources in the same hash are never touched. Every call
can be repeated, so a chunk that failed on a dropped connection is simply sent again.

What the writer cannot see from its replies, it checks: the server's ``run_id`` against
the one the driver read before any write (a restart without persistence loses what was
acknowledged), and ``evicted_keys`` against the driver's baseline (an eviction policy
may drop keys this run wrote).
"""

from __future__ import annotations

import hiredis
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis

from serializers.batch import EncodedBatch
from serializers.keys import ttl_with_jitter
from serializers.resp import REPLACED_FUTURE, SKIPPED_NEWER, WRITE_SCRIPT, WRITTEN, EntityCommands, command, entity_commands
from sinks.base import RedisWriteStats
from sinks.errors import CapacityError, TerminalSinkError, TransientSinkError
from sinks.redis.config import RedisSinkConfig, subsecond_of
from sinks.retry import call_with_retries
from stores.redis import TRANSIENT, connect, info_once_loaded, is_transient, node_address, server_address


class CeilingReached(CapacityError):
    def __init__(self, used: int, ceiling: int, stats: RedisWriteStats, oom: bool = False, node: str | None = None):
        self.used, self.ceiling, self.stats, self.oom, self.node = used, ceiling, stats, oom, node
        where = f"Redis Cluster primary {node}" if node else "Redis"
        what = (
            f"{where} refused writes: out of memory (maxmemory reached, used_memory {used:,} B)"
            if oom
            else (f"{where} used_memory {used:,} B passed the hard ceiling {ceiling:,} B")
        )
        super().__init__(f"{what}; this writer stopped after {stats.entities:,} entities ({stats.values_set:,} values)")


class ChunkFailed(TransientSinkError):
    """Retries are exhausted on a node: entities from ``pending_from`` on were not acknowledged."""

    def __init__(self, message: str, pending_from: int):
        super().__init__(message)
        self.pending_from = pending_from


class NotReplicated(redis.ConnectionError):
    """WAIT saw fewer replicas than asked for: the chunk is sent again, like a dropped one."""


class RedisRestarted(TransientSinkError):
    """The server restarted mid-write without persistence: acknowledged writes may be gone."""


class KeysEvicted(TerminalSinkError):
    """Redis evicted keys during the write: some entities this run wrote may be gone."""


def entity_ttls(config: RedisSinkConfig, keys: pa.Array) -> np.ndarray | None:
    """Each key's EXPIRE seconds, or None when the entity type has no TTL (the write PERSISTs)."""
    if not config.ttl_seconds:
        return None
    return np.fromiter((ttl_with_jitter(k, config.ttl_seconds, config.ttl_jitter) for k in keys.to_pylist()), np.int64, len(keys))


class RedisSink:
    def __init__(self, config: RedisSinkConfig):
        self.config = config
        self.client: redis.Redis | None = None
        self.stats = RedisWriteStats()
        self._chunks = 0
        self._prefix = config.key_prefix.encode("utf-8")
        self._conn: redis.Connection | None = None
        """The pipeline's connection: made by redis-py, written to with RESP built here."""
        self._reader: hiredis.Reader | None = None
        self._run_id: str | None = dict(config.run_ids).get(node_address(config.url))
        """The server's run_id before the write (the driver's), else when the pipeline first
        connected: a restart changes it."""
        self._evicted: int | None = dict(config.evicted_keys).get(node_address(config.url))
        self._wait: bytes = b""
        """The WAIT command sent after each chunk (empty: none)."""
        self._wait_for = 0
        self.redirected: list[tuple[int, str]] = []
        """Cluster: (entity index in the last batch, MOVED/ASK reply) of entities to send elsewhere."""

    @property
    def run_id(self) -> str | None:
        """The server's run_id this writer compares with: the driver's baseline, else the one it first saw."""
        return self._run_id

    @property
    def replicas_waited(self) -> int:
        """Replicas each chunk was WAITed for (0: none)."""
        return self._wait_for

    def open(self) -> None:
        c = self.config
        self.client = connect(c)
        try:
            call_with_retries(self.check_ceiling, is_transient=is_transient, retries=c.retries)
        except redis.AuthenticationError as exc:
            raise TerminalSinkError(f"Redis at {server_address(c.url)} refused the credentials: {exc}") from exc
        except TRANSIENT as exc:
            raise TransientSinkError(f"cannot reach Redis at {server_address(c.url)} ({c.retries + 1} attempts): {exc}") from exc

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
        """used_memory when it is past the hard ceiling, else None; checks evictions too."""
        info = self.client.info("memory", "stats")
        self._check_evictions(int(info.get("evicted_keys", 0)))
        ceiling = self.config.ceiling_bytes
        if ceiling is None:
            return None
        used = int(info["used_memory"])
        return used if used > ceiling else None

    def _check_evictions(self, evicted: int) -> None:
        if self._evicted is None:
            self._evicted = evicted
        elif evicted > self._evicted and self.config.stop_on_eviction:
            raise KeysEvicted(
                f"Redis at {server_address(self.config.url)} evicted {evicted - self._evicted:,} key(s) during the write "
                f"(maxmemory-policy {self.client.info('memory').get('maxmemory_policy', '?')}): entities written may be gone; "
                f"this writer stopped after {self.stats.entities:,} entities"
            )

    def check_ceiling(self) -> None:
        used = self._over_ceiling()
        if used is not None:
            raise CeilingReached(used, self.config.ceiling_bytes, self.stats)

    def write_batch(self, batch: EncodedBatch, as_of: pa.Array | None = None) -> RedisWriteStats:
        """Write one encoded batch, pipelined in chunks.

        Returns what this batch wrote (entities, values set and deleted, non-finite values);
        ``.stats`` sums those and the connection figures (bytes, round trips, retries).
        ``as_of``: a freshness value per row (range runs) instead of the config's one."""
        c = self.config
        keys = pc.binary_join_element_wise(self._prefix, batch.ids.cast(pa.binary()), b"")
        freshness = str(c.as_of).encode() if as_of is None else as_of
        commands = entity_commands(
            keys, batch.columns, c.fields, c.freshness_field, freshness, entity_ttls(c, keys), horizon=c.horizon,
            subsecond=subsecond_of(c, batch),
        )  # fmt: skip
        bounds = [(start, min(len(commands), start + c.chunk_entities)) for start in range(0, len(commands), c.chunk_entities)]
        batch_stats = RedisWriteStats(non_finite=batch.non_finite)
        self.stats.non_finite += batch.non_finite
        self.redirected = []
        self._pipeline(commands, keys, bounds, batch_stats)
        return batch_stats

    def _pipeline(self, commands: EntityCommands, keys: pa.Array, bounds: list[tuple[int, int]], batch_stats: RedisWriteStats) -> None:
        """Send the chunks with one in flight: the server runs chunk k while chunk k+1 is sent.

        After a dropped connection, every chunk not yet acknowledged is sent again on a new
        connection (the commands can be repeated). The retry budget is per stretch without
        progress: a resend that gets further starts a new one."""
        chunks = _Chunks(self, commands, keys, bounds, batch_stats)
        while chunks.next < len(bounds):
            reached = chunks.next
            try:
                call_with_retries(chunks.resume, is_transient=is_transient, retries=self.config.retries, on_retry=chunks.on_retry)
            except redis.AuthenticationError as exc:
                raise TerminalSinkError(f"Redis at {server_address(self.config.url)} refused the credentials: {exc}") from exc
            except TRANSIENT as exc:
                self._drop_data()
                if chunks.next > reached:
                    continue  # the resends got further: a new budget for the rest
                start, stop = bounds[chunks.next]
                raise ChunkFailed(
                    f"Redis at {server_address(self.config.url)} failed {chunks.attempts + 1} times on a chunk of {stop - start} "
                    f"entities (first key {keys[start].as_py()!r}): {exc}",
                    pending_from=start,
                ) from exc

    def _connect_data(self) -> None:
        # redis-py makes the connection (TLS, AUTH, SELECT); the pipeline then uses its socket.
        conn = self.client.connection_pool.get_connection()
        conn.connect()
        self._check_not_restarted()
        # the script cache is the server's: empty after a restart or SCRIPT FLUSH, so load it
        # on every (re)connect; EVALSHA then finds it (NOSCRIPT otherwise: resent after this)
        self.client.script_load(WRITE_SCRIPT)
        if self.config.wait_replicas:
            # wait for the replicas there are: a promoted replica may have none yet
            attached = int(self.client.info("replication").get("connected_slaves", 0))
            self._wait_for = min(self.config.wait_replicas, attached)
            self._wait = (
                command(b"WAIT", str(self._wait_for).encode(), str(self.config.wait_timeout_ms).encode()) if self._wait_for else b""
            )
        self._conn = conn
        self._reader = hiredis.Reader()

    def _check_not_restarted(self) -> None:
        """A server that restarted mid-write without persistence has lost what it had
        acknowledged, which no resend of the pending chunks brings back: stop, ask for a rerun."""
        info = info_once_loaded(self.client, "server")
        run_id = info["run_id"]
        if self._run_id is not None and run_id != self._run_id and not int(info.get("aof_enabled", 0)):
            raise RedisRestarted(
                f"Redis at {server_address(self.config.url)} restarted during the write without persistence (AOF off): "
                f"keys this writer wrote before may be lost; rerun the date"
            )
        self._run_id = run_id

    def _drop_data(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()
            self.client.connection_pool.release(self._conn)
            self._conn = None

    def _send(self, data: memoryview, tail: bytes = b"") -> None:
        try:
            self._conn._sock.sendall(data)
            if tail:
                self._conn._sock.sendall(tail)
        except OSError as exc:
            raise redis.ConnectionError(f"sending to Redis failed: {exc}") from exc
        self.stats.bytes_sent += len(data) + len(tail)
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

    def _acknowledge(self, commands: EntityCommands, keys: pa.Array, bound: tuple[int, int], batch_stats: RedisWriteStats) -> None:
        """Read one chunk's replies and count what it wrote; stop on the first refused command.

        One reply per entity: 1 written, 0 left as it was (the hash holds a newer snapshot
        of this source), 2 written over an as-of time beyond the horizon, or an error, in which case the script did nothing (it is refused
        before it runs). ``values_deleted`` counts the null features cleared whether or not
        the field was there, so a resent chunk or a retried task counts the same as a clean run."""
        start, stop = bound
        replies = self._replies(stop - start + bool(self._wait))
        if self._wait:
            self._check_replicated(replies.pop())
        if any(isinstance(r, hiredis.ReplyError) and str(r).startswith("NOSCRIPT") for r in replies):
            # the server lost its script cache (SCRIPT FLUSH, a restart): reconnect, load, resend
            raise redis.ConnectionError(f"Redis at {server_address(self.config.url)} answered NOSCRIPT: the write script is loaded again")
        ok = [r if not isinstance(r, hiredis.ReplyError) else None for r in replies]
        written = np.fromiter((r == WRITTEN or r == REPLACED_FUTURE for r in ok), bool, stop - start)
        skipped, replaced = ok.count(SKIPPED_NEWER), ok.count(REPLACED_FUTURE)
        refused = None
        for i, reply in enumerate(replies):
            if not isinstance(reply, hiredis.ReplyError):
                continue
            if self.config.cluster and str(reply).startswith(("MOVED ", "ASK ", "CLUSTERDOWN", "TRYAGAIN")):
                # the slot moved or is moving, or the cluster is electing a new primary: the
                # entity is sent again (where the reply says) after a refresh of the map
                self.redirected.append((start + i, str(reply)))
            elif refused is None:
                refused = i
        values_set = commands.values_set[start:stop]
        chunk = RedisWriteStats(
            entities=int(written.sum()),
            values_set=int(values_set[written].sum()),
            values_deleted=int((len(self.config.fields) - values_set[written]).sum()),
            skipped_newer=skipped,
            replaced_future=replaced,
        )
        batch_stats.add(chunk)
        for name in ("entities", "values_set", "values_deleted", "skipped_newer", "replaced_future"):
            setattr(self.stats, name, getattr(self.stats, name) + getattr(chunk, name))
        if refused is None:
            return
        reply = replies[refused]
        if str(reply).startswith("OOM"):
            # Redis's own maxmemory was reached before our ceiling noticed: stop, and report
            # what was written (the counts above include this chunk's accepted entities).
            used = self.used_memory()
            raise CeilingReached(used, self.config.ceiling_bytes or used, self.stats, oom=True) from reply
        raise TerminalSinkError(
            f"Redis at {server_address(self.config.url)} refused a command for key {keys[start + refused].as_py()!r}: {reply}"
        ) from reply

    def _check_replicated(self, reply) -> None:
        if isinstance(reply, hiredis.ReplyError) or reply < self._wait_for:
            raise NotReplicated(
                f"Redis at {server_address(self.config.url)}: {reply} of {self._wait_for} replica(s) confirmed a chunk "
                f"within {self.config.wait_timeout_ms} ms (WAIT)"
            )


class _Chunks:
    """One batch's chunks as RedisSink._pipeline sends them, one in flight: how far the
    acknowledgements got, and the attempts of the current stretch without progress."""

    def __init__(
        self, sink: RedisSink, commands: EntityCommands, keys: pa.Array, bounds: list[tuple[int, int]], batch_stats: RedisWriteStats
    ):
        self.sink, self.commands, self.keys, self.bounds, self.batch_stats = sink, commands, keys, bounds, batch_stats
        self.next = 0
        """The first chunk whose replies have not been read."""
        self.attempts = 0
        """The last retry's attempt number (call_with_retries's count)."""

    def resume(self) -> None:
        """Send every chunk from ``next`` on (connecting first if need be), reading each one's
        replies once the following one is on its way."""
        sink = self.sink
        if sink._conn is None:
            sink._connect_data()
        in_flight: int | None = None
        for k in range(self.next, len(self.bounds)):
            sink._send(self.commands.wire_bytes(*self.bounds[k]), sink._wait)
            if in_flight is not None:
                self._acknowledge_chunk(in_flight, k)
            in_flight = k
        if in_flight is not None:
            self._acknowledge_chunk(in_flight, None)

    def on_retry(self, attempt: int, exc: BaseException) -> None:
        self.attempts = attempt
        self.sink.stats.retries += 1
        self.sink._drop_data()

    def _acknowledge_chunk(self, index: int, in_flight: int | None) -> None:
        """Read chunk ``index``'s replies; stop at the ceiling (Redis's OOM, or used_memory
        rechecked every ``recheck_every`` chunks) with the chunk ``in_flight`` counted too."""
        sink = self.sink
        try:
            sink._acknowledge(self.commands, self.keys, self.bounds[index], self.batch_stats)
        except CeilingReached as exc:
            self._count_in_flight(in_flight)
            raise CeilingReached(exc.used, exc.ceiling, sink.stats, exc.oom) from exc
        self.next = index + 1
        sink._chunks += 1
        if sink._chunks % sink.config.recheck_every == 0 and (used := sink._over_ceiling()) is not None:
            self._count_in_flight(in_flight)
            raise CeilingReached(used, sink.config.ceiling_bytes, sink.stats)

    def _count_in_flight(self, in_flight: int | None) -> None:
        # that chunk is already on its way: count it, so the report says what was written
        if in_flight is not None:
            try:
                self.sink._acknowledge(self.commands, self.keys, self.bounds[in_flight], self.batch_stats)
            except (CeilingReached, *TRANSIENT):
                pass  # counted up to Redis's refusal; a lost reply must not turn the stop into a resend
