"""One Redis connection shared by the concurrent reads of an event loop.

Each read's commands are queued and written together with those of the other reads of
the same turn of the event loop (one system call for all of them); the replies come back
in order, and each goes to its read as it arrives (hiredis parses them). Under load many
reads share a write and a wake-up; alone, a read costs what it did on a connection of its
own. redis-py opens the connection (TLS, AUTH, SELECT: everything its URL and options
say), then the socket's bytes come here instead of to its stream reader.

Deadlines are the connection's, not a timer per read: every read has the same timeout,
so the oldest waits longest, and one timer set for it is enough. A read past its deadline
fails with a timeout, and one whose caller gave up (its own deadline, a cancelled task)
is dropped; either way its replies are still read and dropped as they come, so the
connection stays in step. A connection silent for as long as the timeout while a read
waits on it (since that read went out, or since the last bytes came, whichever is later)
is taken for dead and closed, failing every read on it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol

import hiredis
import redis

SLACK = 0.002
"""A deadline this close is taken as passed (the loop's clock and timers have millisecond steps)."""
STEP = 0.001
"""The deadline timer's shortest wait (a shorter one would spin on a millisecond clock)."""
PUSH = getattr(hiredis, "PushNotification", ())
"""RESP3 pushes (a redis:// URL may ask for protocol 3): not replies to anything sent."""


class Replies(Protocol):
    """What a read does with its replies (redis_reads._Replies)."""

    def add(self, reply: list) -> None: ...
    def refuse(self, exc: Exception) -> None: ...


class _Waiting:
    __slots__ = ("done", "left", "replies", "sent")

    def __init__(self, replies: Replies, left: int, done: asyncio.Future, sent: float):
        self.replies, self.left, self.done, self.sent = replies, left, done, sent


class RedisPipe(asyncio.Protocol):
    def __init__(self, conn, where: str, timeout: float):
        self.conn, self.where, self.timeout = conn, where, timeout
        self.loop = asyncio.get_running_loop()
        self.reader = hiredis.Reader(protocolError=redis.InvalidResponse, replyError=redis.ResponseError)
        self.waiting: deque[_Waiting] = deque()
        self.queued: list[bytes] = []
        self.last_data = self.loop.time()
        self.closed: Exception | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._writable: asyncio.Future | None = None
        self.on_close = None  # called with the pipe once it is closed (its reader reopens one)
        self.transport = conn._writer.transport
        self.transport.set_protocol(self)

    @classmethod
    async def open(cls, pool, where: str, timeout: float, connect_timeout: float) -> RedisPipe:
        """A connection made by redis-py's pool (its URL's TLS, credentials and database), taken
        over; its handshake's replies are waited for up to ``connect_timeout``, not a read's deadline."""
        conn = pool.make_connection()
        conn.socket_timeout = connect_timeout
        try:
            await conn.connect()
        except BaseException:  # a refusal, or the caller's deadline mid-handshake: no socket left open
            conn._close()
            raise
        return cls(conn, where, timeout)

    def send(self, wire: bytes, count: int, replies: Replies) -> asyncio.Future:
        """Queue ``count`` commands (RESP in ``wire``); the future is done when their replies
        have all gone to ``replies``; it fails with redis.TimeoutError past the timeout, or
        with the connection."""
        if self.closed is not None:
            raise _copy(self.closed)
        done = self.loop.create_future()
        if count == 0:  # nothing to wait for (an entry with no replies due would take another read's)
            done.set_result(None)
            return done
        now = self.loop.time()
        self.waiting.append(_Waiting(replies, count, done, now))
        if self._timer is None:
            self._timer = self.loop.call_at(now + self.timeout, self._expire)
        if not self.queued:
            self.loop.call_soon(self._flush)
        self.queued.append(wire)
        return done

    def _flush(self) -> None:
        if self.queued and self.closed is None:
            self.transport.write(b"".join(self.queued) if len(self.queued) > 1 else self.queued[0])
        self.queued.clear()

    @property
    def paused(self) -> bool:
        return self._writable is not None

    async def writable(self) -> None:
        """Wait while the transport's buffer is over its high-water mark (a slow Redis)."""
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def _expire(self) -> None:
        """The oldest read's deadline: the reads past theirs fail; the timer moves to the next."""
        self._timer = None
        if not self.waiting or self.closed is not None:
            return
        now, slack = self.loop.time(), min(SLACK, self.timeout / 2)
        silent_since = max(self.last_data, self.waiting[0].sent)
        if now - silent_since >= self.timeout - slack:
            self.close(redis.TimeoutError(f"Redis at {self.where} sent nothing for {self.timeout * 1000:.0f} ms"))
            return
        after = silent_since + self.timeout  # the next look for a dead connection
        for waiting in self.waiting:  # in the order sent: the oldest first
            if now - waiting.sent < self.timeout - slack:
                after = min(after, waiting.sent + self.timeout)
                break
            if not waiting.done.done():
                waiting.done.set_exception(redis.TimeoutError())
        self._timer = self.loop.call_at(max(after, now + STEP), self._expire)

    # asyncio.Protocol
    def data_received(self, data: bytes) -> None:
        self.last_data = self.loop.time()
        self.reader.feed(data)
        try:
            while (reply := self.reader.gets()) is not False:
                if isinstance(reply, PUSH):
                    continue
                head = self.waiting[0]
                if not head.done.done():  # a read that gave up: its replies are read and dropped
                    try:
                        if isinstance(reply, redis.ResponseError):  # e.g. WRONGTYPE: the rest is read, the read fails
                            head.replies.refuse(reply)
                        else:
                            head.replies.add(reply)
                    except Exception as exc:  # decoding: this read fails, the others go on
                        head.done.set_exception(exc)
                head.left -= 1
                if head.left == 0:
                    self.waiting.popleft()
                    if not head.done.done():
                        head.done.set_result(None)
        except (redis.InvalidResponse, IndexError) as exc:  # out of step: nothing after it can be trusted
            self.close(redis.ConnectionError(f"Redis at {self.where}: {type(exc).__name__}: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed is None:
            self.closed = redis.ConnectionError(f"Redis at {self.where} closed the connection" + (f": {exc}" if exc else ""))
        self.conn._close()  # redis-py's side of it: no longer open (it would warn when collected)
        self._fail(self.closed)
        self._closed_now()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = self.loop.create_future()

    def resume_writing(self) -> None:
        if self._writable is not None:
            self._writable.set_result(None)
            self._writable = None

    def close(self, error: Exception) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.closed is None:
            self.closed = error
            self.conn._close()  # the transport, and redis-py's record of it
        self._fail(error)
        self._closed_now()

    def _closed_now(self) -> None:
        callback, self.on_close = self.on_close, None
        if callback is not None:
            callback(self)

    def _fail(self, error: Exception) -> None:
        while self.waiting:
            head = self.waiting.popleft()
            if not head.done.done():
                head.done.set_exception(_copy(error))
        self.resume_writing()


def _copy(error: Exception) -> Exception:
    """A fresh exception per read: one instance raised in many tasks would gather their tracebacks."""
    return type(error)(*error.args)
