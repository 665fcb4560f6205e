"""Reads from Redis: one pipelined ``HMGET`` per entity key per batch, of the requested
fields of every source involved plus each source's freshness field, then the columns
decoded (feature_reader/decode.py).

Redis Cluster goes through redis-py's cluster client, which groups a pipeline's keys by
slot owner, sends one pipeline per primary (at once in the asyncio client) and follows
``MOVED`` and ``ASK``. The writers keep their own router (sinks/redis/router.py): they
need per-primary ceilings and WAIT, a reader needs none of that.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import redis

from feature_defs import Definitions, FeatureDef
from feature_reader.decode import BAD, ColumnDecoder, json_extra_bytes
from feature_reader.decode import as_of as stored_as_of
from feature_reader.errors import ReadTimeout, StoreError
from feature_reader.redis_pipe import RedisPipe
from feature_reader.rows import BAD_AS_OF_ROW, NOT_FOUND_ROW, Layout, SourceRow, Unit
from fm_config.redis import RedisConnection
from serializers import field_id
from serializers.keys import freshness_field, key_prefix, redis_key
from serializers.resp import bulks, command, key_command_format
from stores.redis import connect, connect_async, connect_cluster, connect_cluster_async, server_address

PER_VALUE_BYTES = 48
"""Cache size estimate per value beyond its stored bytes (Python objects)."""

CHUNK = 128
"""Replies decoded at a time while the rest are still on their way (the server keeps
working on the batch meanwhile: decoding overlaps the round trip)."""

HMGET = key_command_format(b"HMGET")
"""``HMGET % (fields + 2, len(key), key, the fields as RESP)``: a key's read, the fields pre-built per source."""


class _Fields:
    """Per (source, features read): the field ids (its freshness field first), as RESP too,
    and where each feature sits in a row; made once per reader and kept."""

    def __init__(self, source: str, feats: list[FeatureDef]):
        self.feats = feats
        self.ids = [freshness_field(source)] + [field_id(f.stored_name) for f in feats]
        self.wire = bulks(self.ids)
        self.names = Layout([f.name for f in feats])
        self.decoder = ColumnDecoder(feats)
        # json values are Python objects several times their stored bytes (decode.JSON_OBJECT_BYTES)
        has_json = any(f.type == "json" for f in feats)
        self.json_bytes = (lambda raws: json_extra_bytes(feats, raws)) if has_json else (lambda raws: 0)


class _Plan:
    """Which key each unit reads, and where its fields sit in the key's reply."""

    def __init__(self, reads, units: Sequence[Unit], features: dict[str, list[FeatureDef]]):
        self.fields = {name: reads.fields(name, feats) for name, feats in features.items()}
        self.features = features
        defs = reads.defs
        if len(features) == 1:  # one source (the common case): a key per unit, each once
            (source,) = features
            prefix = key_prefix(defs.entities[defs.sources[source].entity].prefix, reads.namespace)
            self.keys = [redis_key(prefix, u.entity_id) for u in units]
            if len(set(self.keys)) == len(self.keys) and all(u.source == source for u in units):
                self.units = [[(u, 0)] for u in units]
                return
        by_key: dict[bytes, list[Unit]] = {}
        prefixes: dict[str, bytes] = {}
        for unit in units:
            prefix = prefixes.get(unit.source)
            if prefix is None:
                entity = defs.entities[defs.sources[unit.source].entity]
                prefix = prefixes[unit.source] = key_prefix(entity.prefix, reads.namespace)
            by_key.setdefault(redis_key(prefix, unit.entity_id), []).append(unit)
        self.keys = list(by_key)
        self.units: list[list[tuple[Unit, int]]] = []  # per key: (unit, its first field in the reply)
        for key in self.keys:
            at, placed = 0, []
            for unit in by_key[key]:
                placed.append((unit, at))
                at += len(self.fields[unit.source].ids)
            self.units.append(placed)

    def key_fields(self, k: int) -> list[bytes]:
        return [f for unit, _ in self.units[k] for f in self.fields[unit.source].ids]

    def wire(self, first: int = 0, end: int | None = None) -> bytes:
        """The HMGETs of keys ``first`` to ``end`` as RESP, built from each source's pre-built fields."""
        out, hmget = [], HMGET
        for key, placed in zip(self.keys[first:end], self.units[first:end]):
            if len(placed) == 1:
                fields = self.fields[placed[0][0].source]
                out.append(hmget % (len(fields.ids) + 2, len(key), key, fields.wire))
            else:
                count = sum(len(self.fields[u.source].ids) for u, _ in placed)
                wires = b"".join(self.fields[u.source].wire for u, _ in placed)
                out.append(hmget % (count + 2, len(key), key, wires))
        return b"".join(out)

    def rows(self, replies: list[list], first: int, as_list: bool) -> dict[Unit, SourceRow]:
        """Decode the replies of keys ``first``.. on, a column per (source, feature)."""
        by_source: dict[str, tuple[list[Unit], list[list]]] = {}
        for reply, placed in zip(replies, self.units[first:]):
            for unit, at in placed:
                units, slices = by_source.setdefault(unit.source, ([], []))
                units.append(unit)
                # a reply may hold other sources' fields after this one's: zip() below stops at the shortest
                slices.append(reply if at == 0 else reply[at:])
        out: dict[Unit, SourceRow] = {}
        for source, (units, slices) in by_source.items():
            feats, fields = self.features[source], self.fields[source]
            width = 1 + len(feats)
            if len(units) == 1:
                out[units[0]] = _row(fields, slices[0][:width], as_list)
                continue
            columns = list(zip(*slices))[:width]
            decoded, holey = fields.decoder.decode(columns[1:], as_list)
            holes = _holes(decoded, holey)
            rows = zip(*decoded) if decoded else [()] * len(units)
            # the cache's size estimate: the stored bytes of a few rows, averaged
            sample = [sum(map(len, filter(None, raw[:width]))) + fields.json_bytes(raw[1:width]) for raw in slices[:8]]
            size = sum(sample) // len(sample) + PER_VALUE_BYTES * width
            for n, (unit, fresh, values) in enumerate(zip(units, columns[0], rows)):
                as_of = stored_as_of(fresh)
                if as_of is None or as_of is BAD:
                    out[unit] = NOT_FOUND_ROW if as_of is None else BAD_AS_OF_ROW
                    continue
                out[unit] = SourceRow(as_of, values, fields.names, size, n not in holes)
        return out


def _row(fields: _Fields, raw: list, as_list: bool) -> SourceRow:
    """One entity's reply (its freshness value first) as a row."""
    as_of = stored_as_of(raw[0])
    if as_of is None or as_of is BAD:  # nothing stored, or a freshness value no writer wrote: nothing of the source is trusted
        return NOT_FOUND_ROW if as_of is None else BAD_AS_OF_ROW
    values, complete = fields.decoder.decode_row(raw[1:], as_list)
    size = sum(map(len, filter(None, raw))) + PER_VALUE_BYTES * len(raw) + fields.json_bytes(raw[1:])
    return SourceRow(as_of, tuple(values), fields.names, size, complete)


def _holes(columns: list[list], holey: list[int]) -> set[int]:
    """Rows with a None or BAD in one of the ``holey`` columns (the decoder names them)."""
    out: set[int] = set()
    for j in holey:
        out.update(i for i, v in enumerate(columns[j]) if v is None or v is BAD)
    return out


class _Replies:
    """A batch's replies as they come off the connection, decoded a chunk at a time (the
    server keeps working on the rest meanwhile: decoding overlaps the round trip)."""

    def __init__(self, plan: _Plan, as_list: bool):
        self.plan, self.as_list = plan, as_list
        self.out: dict[Unit, SourceRow] = {}
        self.chunk: list = []
        self.first = 0
        self.refused: Exception | None = None

    def add(self, reply: list) -> None:
        self.chunk.append(reply)
        if len(self.chunk) == CHUNK:
            self._decode()

    def refuse(self, exc: Exception) -> None:
        self.refused = exc
        self.add([])

    def _decode(self) -> None:
        if self.refused is None:
            self.out.update(self.plan.rows(self.chunk, self.first, self.as_list))
        self.first += len(self.chunk)
        self.chunk = []

    def rows(self) -> dict[Unit, SourceRow]:
        if self.chunk:
            self._decode()
        if self.refused is not None:
            raise self.refused
        return self.out


PING = command(b"PING")


class _Pong:
    """The reply of a PING sent on a reader's connection (a health check)."""

    def __init__(self):
        self.error: Exception | None = None

    def add(self, reply) -> None:
        pass

    def refuse(self, exc: Exception) -> None:
        self.error = exc


def _for_reads(conn, timeout: float):
    """A sync connection just made (connect, TLS, AUTH under the connect timeout): its
    socket now times out at a read's deadline."""
    conn.socket_timeout = timeout
    if conn._sock is not None:
        conn._sock.settimeout(timeout)
    if hasattr(conn._parser, "_socket_timeout"):
        conn._parser._socket_timeout = timeout
    return conn


class _Reads:
    def __init__(
        self, config: RedisConnection, defs: Definitions, namespace: str | None, *, cluster: bool, timeout: float, connect_timeout: float
    ):
        self.defs, self.namespace, self.cluster, self.timeout = defs, namespace, cluster, timeout
        self.connect_timeout = connect_timeout
        self.where = server_address(config.url)
        self._fields: dict[tuple, _Fields] = {}
        self._held = 0  # fields held by self._fields

    def fields(self, source: str, feats: list[FeatureDef]) -> _Fields:
        # keyed by the list's identity: the reader hands over the same lists again (a
        # source's, or a request's kept selection); the entry holds the list, so its id stays its own
        got = self._fields.get((source, id(feats)))
        if got is None or got.feats is not feats:
            if len(self._fields) > 1024 or self._held > 100_000:  # requests name few feature sets; bound it anyway (by fields too)
                self._fields.clear()
                self._held = 0
            self._held += len(feats)
            got = self._fields[(source, id(feats))] = _Fields(source, feats)
        return got

    def _pipeline(self, plan: _Plan):
        pipe = self.client.pipeline(transaction=False)
        for k, key in enumerate(plan.keys):
            pipe.hmget(key, plan.key_fields(k))
        return pipe

    def _error(self, exc: BaseException) -> StoreError:
        if isinstance(exc, (TimeoutError, redis.TimeoutError)):
            return ReadTimeout(f"Redis at {self.where} did not answer in {self.timeout * 1000:.0f} ms")
        return StoreError(f"Redis at {self.where}: {type(exc).__name__}: {exc}")


class RedisReads(_Reads):
    """Synchronous reads (thread-safe: redis-py pools its connections).

    On one server the batch's HMGETs go out as one pre-built write on a pooled connection
    and the replies are decoded a chunk at a time as they arrive; redis-py's pipeline
    packs each command's arguments again, which costs more than the server's work
    (bench/README.md, "Reads"). Redis Cluster: redis-py's cluster pipeline."""

    def __init__(
        self, config: RedisConnection, defs: Definitions, namespace: str | None, *, cluster: bool, timeout: float, connect_timeout: float
    ):
        super().__init__(config, defs, namespace, cluster=cluster, timeout=timeout, connect_timeout=connect_timeout)
        self._idle: list = []  # connections of this reader, free (a list: pop and append are atomic)
        if cluster:
            self.client = connect_cluster(config, socket_timeout=timeout, connect_timeout=connect_timeout)
        else:  # a new connection's handshake (AUTH, SELECT) is read under the connect timeout; then _for_reads
            self.client = connect(config, socket_timeout=connect_timeout, connect_timeout=connect_timeout)

    def read(self, units: Sequence[Unit], features: dict[str, list[FeatureDef]], as_list: bool = False) -> dict[Unit, SourceRow]:
        plan = _Plan(self, units, features)
        try:
            if self.cluster:
                return plan.rows(self._pipeline(plan).execute(), 0, as_list)
            return self._stream(plan, as_list)
        except (redis.RedisError, TimeoutError) as exc:
            raise self._error(exc) from exc

    def _stream(self, plan: _Plan, as_list: bool) -> dict[Unit, SourceRow]:
        # connections this reader took from the pool stay with it: the pool's hand-out
        # checks the socket each time (a system call as long as the read itself)
        conn = self._take()
        ok = False
        try:
            for first in range(0, len(plan.keys), CHUNK):  # the server starts on a chunk while the next is built
                conn.send_packed_command([plan.wire(first, first + CHUNK)])
            replies = _Replies(plan, as_list)
            # the connection's parser (hiredis) straight: Connection.read_response wraps each
            # reply in error mapping that costs a fifth of a batch; this one's failures are
            # redis-py's errors already, and the connection is dropped on any (below)
            read = getattr(getattr(conn, "_parser", None), "read_response", None) or conn.read_response
            for _ in plan.keys:
                reply = read()
                if isinstance(reply, redis.ResponseError):  # e.g. WRONGTYPE: read the rest, then fail the batch
                    replies.refuse(reply)
                else:
                    replies.add(reply)
            out = replies.rows()
            ok = True
            return out
        finally:
            if ok:
                self._idle.append(conn)
            else:  # replies may be left unread on it
                self._drop(conn)

    def _drop(self, conn) -> None:
        """Close a connection and give it back: the pool reconnects it under the connect
        timeout (redis-py sets the socket's timeout from ``socket_timeout`` as it connects)."""
        conn.disconnect()
        conn.socket_timeout = self.connect_timeout
        self.client.connection_pool.release(conn)

    def _take(self):
        try:
            return self._idle.pop()
        except IndexError:
            return _for_reads(self.client.connection_pool.get_connection(), self.timeout)

    def warm(self) -> None:
        """Open a connection ahead of the first read (in the caller's thread; failures ignored:
        the first read connects then)."""
        if self.cluster or self._idle:
            return
        try:
            self._idle.append(self._take())
        except (redis.RedisError, OSError):
            pass

    def ping(self) -> None:
        """PING on one of the reader's own connections; a connection found dropped is replaced once."""
        if self.cluster:
            self.client.ping()
            return
        for attempt in (1, 2):
            conn = self._take()
            ok = False
            try:
                conn.send_packed_command([PING])
                conn.read_response()
                ok = True
                return
            except redis.ConnectionError:
                if attempt == 2:
                    raise
            finally:
                if ok:
                    self._idle.append(conn)
                else:
                    self._drop(conn)

    def close(self) -> None:
        while self._idle:
            self.client.connection_pool.release(self._idle.pop())
        self.client.close()


class AsyncRedisReads(_Reads):
    """asyncio reads. On one server the reader's concurrent reads share one connection
    (feature_reader/redis_pipe.py): the HMGETs of the reads of one event-loop turn go out
    in one write, and each read's replies are decoded a chunk at a time as they arrive.
    Redis Cluster: redis-py's cluster pipeline, one per primary, at once.

    The shared connection is opened in a task of its own, under the connect timeout, not a
    read's deadline: at :meth:`warm` (start), and again in the background when it drops;
    reads that find none wait for that connect, then have their own deadline."""

    def __init__(
        self,
        config: RedisConnection,
        defs: Definitions,
        namespace: str | None,
        *,
        cluster: bool,
        timeout: float,
        connect_timeout: float,
        connections: int = 32,
    ):
        super().__init__(config, defs, namespace, cluster=cluster, timeout=timeout, connect_timeout=connect_timeout)
        timeouts = dict(socket_timeout=timeout, connect_timeout=connect_timeout, max_connections=connections)
        self.client = connect_cluster_async(config, **timeouts) if cluster else connect_async(config, **timeouts)
        self._slots = asyncio.Semaphore(connections)
        self._pipe: RedisPipe | None = None
        self._connecting: asyncio.Task | None = None
        self._closed = False

    async def read(self, units: Sequence[Unit], features: dict[str, list[FeatureDef]], as_list: bool = False) -> dict[Unit, SourceRow]:
        plan = _Plan(self, units, features)
        try:
            if self.cluster:
                async with asyncio.timeout(self.timeout):
                    return plan.rows(await self._pipeline(plan).execute(), 0, as_list)
            return await self._stream(plan, as_list)
        except (redis.RedisError, TimeoutError) as exc:
            raise self._error(exc) from exc

    async def _stream(self, plan: _Plan, as_list: bool) -> dict[Unit, SourceRow]:
        pipe = self._pipe
        if self._slots.locked() or pipe is None or pipe.closed is not None or pipe.paused:
            if pipe is None or pipe.closed is not None:
                await self._connected()  # under the connect timeout, not the read's deadline
            # a wait for a slot or room to write: within the read's deadline
            # (the usual case waits for none of them and pays no timer)
            async with asyncio.timeout(self.timeout):
                await self._slots.acquire()
                try:
                    pipe = await self._ready()
                except BaseException:
                    self._slots.release()
                    raise
        else:
            await self._slots.acquire()  # free: taken at once
        try:  # at most ``connections`` reads at once; the other callers wait
            replies = _Replies(plan, as_list)
            await pipe.send(plan.wire(), len(plan.keys), replies)  # its deadline: the connection's
            return replies.rows()
        finally:
            self._slots.release()

    async def _ready(self) -> RedisPipe:
        pipe = await self._connected()
        await pipe.writable()
        return pipe

    async def _connected(self) -> RedisPipe:
        pipe = self._pipe
        if pipe is not None and pipe.closed is None:
            return pipe
        if self._closed:
            raise redis.ConnectionError("the reader was closed")
        if self._connecting is None or self._connecting.done():  # one connect at a time: the reads waiting meanwhile share it
            self._connecting = asyncio.get_running_loop().create_task(self._open())
            self._connecting.add_done_callback(_retrieved)
        return await asyncio.shield(self._connecting)  # a caller giving up does not abort the connect

    async def _open(self) -> RedisPipe:
        try:
            async with asyncio.timeout(self.connect_timeout):
                pipe = await RedisPipe.open(self.client.connection_pool, self.where, self.timeout, self.connect_timeout)
        except TimeoutError:
            raise redis.ConnectionError(f"no connection within {self.connect_timeout * 1000:.0f} ms (reader.connect_timeout_ms)") from None
        if self._closed:
            pipe.close(redis.ConnectionError("the reader was closed"))
            raise redis.ConnectionError("the reader was closed")
        pipe.on_close = self._dropped
        self._pipe = pipe
        return pipe

    def _dropped(self, pipe: RedisPipe) -> None:
        """The shared connection closed (killed, timed out, server gone): reopened in the
        background, once; if that fails, the next read or health check tries again."""
        if not self._closed and self._pipe is pipe and (self._connecting is None or self._connecting.done()):
            self._connecting = asyncio.get_running_loop().create_task(self._open())
            self._connecting.add_done_callback(_retrieved)

    def warm(self) -> None:
        """Open the shared connection in the background (call on the reader's event loop)."""
        if not self.cluster and not self._closed and self._pipe is None and self._connecting is None:
            self._connecting = asyncio.get_running_loop().create_task(self._open())
            self._connecting.add_done_callback(_retrieved)

    async def connected(self, within: float) -> bool:
        """Whether the shared connection is open, or opens within ``within`` seconds (the
        connect goes on in the background after): the reader asks this, with a read's
        deadline, of a Redis that failed its last call, so a read waits no longer than that."""
        pipe = self._pipe
        if self.cluster or (pipe is not None and pipe.closed is None):
            return True
        try:
            async with asyncio.timeout(within):
                await self._connected()
            return True
        except (TimeoutError, redis.RedisError, OSError):
            return False

    async def ping(self) -> None:
        """PING on the shared connection; one found dropped is replaced and asked once more."""
        if self.cluster:
            await self.client.ping()
            return
        for attempt in (1, 2):
            try:
                pipe = await self._ready()
                pong = _Pong()
                await pipe.send(PING, 1, pong)
                if pong.error is not None:
                    raise pong.error
                return
            except redis.ConnectionError:
                if attempt == 2:
                    raise

    async def close(self) -> None:
        self._closed = True
        if self._connecting is not None and not self._connecting.done():
            self._connecting.cancel()
        if self._pipe is not None:
            self._pipe.close(redis.ConnectionError("the reader was closed"))
        await self.client.aclose()


def _retrieved(task: asyncio.Task) -> None:
    """A background connect's failure is reported by the reads that wait for it, not logged."""
    if not task.cancelled():
        task.exception()
