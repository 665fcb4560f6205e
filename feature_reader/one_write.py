# Subclasses uvicorn's HttpToolsProtocol and relies on its internals: tested with uvicorn 0.54, the range
# pyproject.toml's [server] extra pins (uvicorn>=0.54,<0.55); check this module again before widening it.
"""uvicorn's httptools protocol, writing each response in one send, with the bounds a
server facing hostile clients needs.

uvicorn writes a response's head and its body with two writes, and the event loop sends
each at once: two system calls and two TCP segments per response, and on loopback each
send costs about as much as the receiver's work on it. Here the writes of one turn of
the event loop go out together (a response's head and body).

Bounds uvicorn does not have (``Limits``, from ``server:`` in conf):

- a request's head and body must arrive within ``read_timeout`` of its first byte (408,
  the connection closed): a client sending half a request holds nothing for long;
- a connection that sends no request at all is closed after ``idle_timeout``, as after a
  response (uvicorn arms its keep-alive timer only after a first response);
- the request head is at most ``max_header_bytes`` and ``max_headers`` lines (431):
  httptools buffers a header line whole before handing it over, with no limit;
- an answer must leave for the client's socket within ``write_timeout`` of being written,
  else the connection is dropped with it: a client that stops reading pins nothing for
  long. The next request of a connection starts only once its last answer has left, so
  no answer is made to wait in memory behind one; every close is bounded alike;
- answer bytes waiting for slow clients, over all connections, are at most
  ``max_unsent_bytes``: past it new requests and connections get 503 and are closed;
- past ``max_connections`` open connections a new one is answered 503 and closed;
- at most ``MAX_PIPELINED`` requests of a connection wait behind the one being answered
  (uvicorn parses every request of what it read, 256 KiB at once: 89 waiting requests a
  connection were seen); past it the rest of what the client sent is dropped and the
  connection closes after the waiting ones are answered (a pipelining client sends again
  what a closed connection did not answer). A connection that is lost lets its waiting
  requests go at once, rather than at Python's next full collection;
- at shutdown a request whose body is still coming is answered 503 and closed at once
  (it is not in flight: nothing was read for it yet); an answer still unsent gets half
  the shutdown grace (at most ``write_timeout``) to leave, then its connection is dropped.

Warnings a caller without a token can cause (a malformed request, an upgrade to websocket or
h2c, which this server does not speak) are logged at most once a minute each, with how many
came since the last line (``QuietWarnings``): a caller repeating them cannot fill the log.

Refusals are JSON bodies like the application's (``{"error": ..., "type": ...}``), then a
lingering close: the write side is shut, what the client still sends is read and
dropped for up to ``LINGER`` seconds, so the client reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import socket
import struct
import time
from dataclasses import dataclass

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from fm_config.reader import ServerSettings

LINGER = 2.0
"""Seconds a refused connection is read (and dropped) before it closes."""
MAX_PIPELINED = 16
"""Requests of one connection parsed and waiting behind the one being answered."""


def _nothing() -> None:
    pass


@dataclass(frozen=True)
class Limits:
    """A connection's bounds (seconds, bytes, counts); from ``server:`` in conf."""

    read_timeout: float
    idle_timeout: float
    write_timeout: float
    max_header_bytes: int
    max_headers: int
    max_connections: int
    max_unsent_bytes: int
    shutdown_grace: float

    @classmethod
    def from_settings(cls, server) -> Limits:
        return cls(
            read_timeout=server.read_timeout_ms / 1000, idle_timeout=server.idle_timeout_ms / 1000,
            write_timeout=server.write_timeout_ms / 1000, shutdown_grace=server.shutdown_grace_ms / 1000,
            max_header_bytes=server.max_header_bytes, max_headers=server.max_headers, max_connections=server.max_connections,
            max_unsent_bytes=server.max_unsent_bytes,
        )  # fmt: skip


def _glibc(name: str):
    try:
        return getattr(ctypes.CDLL(None), name, None)  # glibc's; elsewhere none
    except OSError:
        return None


_MALLOC_TRIM = _glibc("malloc_trim")
_MALLOPT = _glibc("mallopt")
M_MMAP_THRESHOLD = -3
LARGE = 128 << 10
"""Allocations from this size up get pages of their own, given back when freed."""


def fixed_mmap_threshold() -> None:
    """Keep glibc's mmap threshold at 128 KiB. It rises by itself to the largest block freed
    (up to 32 MiB): after one 1 MB request body or answer was freed, later ones came from
    the heap, whose freed pages glibc keeps (the RSS stayed up by the largest bodies seen).
    A fixed threshold gives every large body and answer its own pages, unmapped when freed."""
    if _MALLOPT is not None:
        _MALLOPT(M_MMAP_THRESHOLD, LARGE)


class QuietWarnings:
    """At most one warning per kind each ``every`` seconds; the next line says how many were not logged."""

    def __init__(self, logger: logging.Logger, every: float = 60.0, clock=time.monotonic):
        self.logger, self.every, self.clock = logger, every, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def warn(self, message: str) -> None:
        now, last = self.clock(), self._last.get(message)
        if last is not None and now - last < self.every:
            self._held[message] = self._held.get(message, 0) + 1
            return
        held = self._held.pop(message, 0)
        self._last[message] = now
        since = f" ({held:,} more in the last {now - last:.0f} s, not logged)" if held else ""
        self.logger.warning("%s%s", message, since)


WARNINGS = QuietWarnings(logging.getLogger("uvicorn.error"))


class _Unsent:
    """Answer bytes written and not yet taken by the clients' sockets, over the process's
    connections: each counts, when the transport pauses its writes, the larger of its buffer
    and its last write (the buffer holds a view of it: all of it stays in memory)."""

    bytes = 0

    def dropped(self, loop: asyncio.AbstractEventLoop) -> None:
        """A connection was dropped with what it held: once the transport has let its buffers go, glibc
        is asked to give the freed memory back."""
        give_back_soon(loop)


UNSENT = _Unsent()
_trim: asyncio.TimerHandle | None = None


def give_back_soon(loop: asyncio.AbstractEventLoop) -> None:
    """Within a second, glibc is asked to give freed memory back to the system (``malloc_trim``): after
    a large body or answer, whose parts (a 1 MB body's thousand 1 KB strings) come from the heap,
    where glibc keeps freed pages (the RSS stays up by them). At most once a second, however often asked."""
    global _trim
    if _trim is None and _MALLOC_TRIM is not None:
        _trim = loop.call_later(1.0, _trimmed)


def _trimmed() -> None:
    global _trim
    _trim = None
    _MALLOC_TRIM(0)  # type: ignore[misc]


class _Refused(Exception):
    """Raised in a parser callback to stop parsing; the answer is written already."""


class _OneWrite:
    """A connection's transport whose writes in one turn of the event loop go out as one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, close_within: float | None = None):
        self._transport, self._loop = transport, loop
        self._queued: list[bytes] = []
        self.flushed = 0
        """The size of the last write."""
        self.close_within = close_within
        """Seconds a closed connection gets to send what it holds before it is dropped (None: no bound)."""
        self._abort: asyncio.TimerHandle | None = None

    def write(self, data: bytes) -> None:
        if not self._queued:
            self._loop.call_soon(self._flush)
        self._queued.append(data)

    def _flush(self) -> None:
        if self._queued:
            data = b"".join(self._queued)
            self._queued.clear()
            self.flushed = len(data)
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        if self._transport.is_closing():
            return
        self._flush()  # a response's last bytes, then the close
        self._transport.close()  # which waits for the buffer to drain: a client that never reads would hold it
        if self.close_within is not None:
            self.abort_within(self.close_within)

    def abort_within(self, seconds: float) -> None:
        """Drop the connection, and what it still holds, unless it is gone (or ``keep`` is
        called) within ``seconds``; of two such deadlines the earlier stands."""
        due = self._loop.time() + seconds
        if self._abort is not None:
            if self._abort.when() <= due:
                return
            self._abort.cancel()
        self._abort = self._loop.call_at(due, self._drop)

    def _drop(self) -> None:
        sock = self._transport.get_extra_info("socket")
        if sock is not None:  # a reset rather than a close: the kernel drops what it still holds for the client too
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._transport.abort()
        UNSENT.dropped(self._loop)

    def keep(self) -> None:
        if self._abort is not None:
            self._abort.cancel()
            self._abort = None

    def __getattr__(self, name: str):
        return getattr(self._transport, name)


class OneWriteProtocol(HttpToolsProtocol):
    limits = Limits.from_settings(ServerSettings())  # the defaults of server: in conf, when uvicorn is not handed others

    def __init__(self, *args, limits: Limits | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        if limits is not None:
            self.limits = limits
        self.timeout_keep_alive = self.limits.idle_timeout
        self._read_timer: asyncio.TimerHandle | None = None
        self._reading_since: float | None = None
        """When the request being read began (loop time); None between requests."""
        self._in_head = self._chunk_done = False
        """_chunk_done: a request ended in the chunk being fed (one beginning after it has only part of the chunk)."""
        self._head_raw = self._head_slack = self._fed = 0
        self._refused = self._full = False
        """_full: MAX_PIPELINED requests wait; what the client sends after them is dropped."""
        self._unsent = 0
        """This connection's part of UNSENT."""
        self._waiting = False
        """A request read while the last answer had not left: started once it has (resume_writing)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_OneWrite(transport, self.loop, self.limits.write_timeout))  # type: ignore[arg-type]
        # writes pause whenever the socket leaves bytes of them, and resume once all have left: the span
        # the write deadline bounds (high 1, not 0: a TLS transport pauses at a size >= high, and may at once)
        transport.set_write_buffer_limits(high=1, low=0)
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, f"too many connections (server.max_connections {self.limits.max_connections:,}); retry later", "Overloaded")
            return
        if UNSENT.bytes > self.limits.max_unsent_bytes:
            self._overloaded()
            return
        # until its first request, as between requests: closed when idle
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        self._release()
        self.transport.keep()  # type: ignore[attr-defined]
        super().connection_lost(exc)
        # a waiting request's cycle links back to this protocol (its on_response): a reference
        # cycle only a full collection frees, rare in this server; unlinked, each goes now
        for cycle, _app in self.pipeline:
            cycle.on_response = _nothing
        self.pipeline.clear()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.on_response = _nothing  # one running resets it when it ends; one never started would not

    def data_received(self, data: bytes) -> None:
        if self._refused or self._full:
            return  # lingering, or past the waiting requests: read and dropped
        self._unset_keepalive_if_required()
        self._fed, self._chunk_done = len(data), False
        if self._in_head:  # a head begun in an earlier chunk: the parser holds these bytes until the line ends
            self._head_raw += self._fed
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                WARNINGS.warn("Unsupported upgrade request (websocket, h2c): answered as plain HTTP.")
            return
        except httptools.HttpParserError:
            if self._full:
                self.cycle.keep_alive = False  # the last one waiting: its answer closes the connection
                return
            if not self._refused:
                WARNINGS.warn("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        if self._in_head and self._head_raw - self._head_slack > self.limits.max_header_bytes:
            self._too_large()  # still in the head after these bytes: all of them are the head's

    def on_message_begin(self) -> None:
        if len(self.pipeline) >= MAX_PIPELINED:
            self._full = True
            raise _Refused  # stops the parser: this request and the rest are dropped
        super().on_message_begin()
        # the chunk it begins in counts whole; where a request ended earlier in that chunk (pipelined),
        # the chunk is slack: the head is then measured when it ends (on_headers_complete)
        self._in_head, self._head_raw = True, self._fed
        self._head_slack = self._fed if self._chunk_done else 0
        self._reading_since = now = self.loop.time()
        if self._read_timer is None:  # one timer per connection, re-armed when it fires: not one per request
            self._read_timer = self.loop.call_at(now + self.limits.read_timeout, self._check_read)

    def on_headers_complete(self) -> None:
        self._in_head = False
        limit = self.limits.max_header_bytes
        # _head_raw bounds the head from above: only a head that may pass the limit is measured
        # (counting in on_header cost 1.3 us a request)
        if len(self.headers) > self.limits.max_headers or (self._head_raw > limit and self._head_bytes() > limit):
            self._too_large()
            raise _Refused  # stops the parser: the application never sees it
        if UNSENT.bytes > self.limits.max_unsent_bytes:
            self._overloaded()
            raise _Refused
        super().on_headers_complete()

    def _head_bytes(self) -> int:
        """The head's bytes as sent with one space after each colon: request line, header lines, blank line."""
        return len(self.parser.get_method()) + len(self.url) + 12 + sum(len(n) + len(v) + 4 for n, v in self.headers) + 2

    def on_message_complete(self) -> None:
        self._reading_since, self._chunk_done = None, True
        super().on_message_complete()

    def _start_asgi_task(self, cycle, app) -> None:
        if self.flow.write_paused:  # the last answer has not left: this one is made once it has, not to wait in memory
            self.flow.pause_reading()
            self.pipeline.append((cycle, app))  # the next to start: pop() takes from this end
            self._waiting = True
            return
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        if self.pipeline:
            self.transport._flush()  # type: ignore[attr-defined]  # written now: whether it left decides when the next starts
        super().on_response_complete()

    def pause_writing(self) -> None:
        super().pause_writing()
        self._release()
        self._unsent = max(self.transport.get_write_buffer_size(), self.transport.flushed)  # type: ignore[attr-defined]
        UNSENT.bytes += self._unsent
        self.transport.abort_within(self.limits.write_timeout)  # type: ignore[attr-defined]

    def resume_writing(self) -> None:
        super().resume_writing()
        self._release()
        if self.transport.is_closing():
            return  # its close's deadline stands; no request starts
        self.transport.keep()  # type: ignore[attr-defined]
        if self._waiting:
            self._waiting = False
            super()._start_asgi_task(*self.pipeline.pop())

    def _release(self) -> None:
        UNSENT.bytes -= self._unsent
        self._unsent = 0

    def shutdown(self) -> None:
        # what is still unsent gets half the grace to leave: the process waits for its connections until then
        transport = self.transport
        transport.close_within = min(self.limits.write_timeout, self.limits.shutdown_grace / 2)  # type: ignore[attr-defined]
        cycle = self.cycle
        if self.flow.write_paused:
            transport.close()  # its last answer has not left; a request read behind it was not started
        elif cycle is not None and not cycle.response_started and cycle.more_body:
            self._refuse(503, "the server is stopping; retry on another", "ShuttingDown", linger=False)
        elif self._in_head:
            transport.close()  # a request whose head is still coming: nothing to answer yet
        else:
            super().shutdown()
        if transport.is_closing():  # closed before (a refusal's linger), or now
            transport.abort_within(transport.close_within)  # type: ignore[attr-defined]

    def _too_large(self) -> None:
        self._refuse(
            431,
            f"the request head passes {self.limits.max_header_bytes:,} bytes or {self.limits.max_headers:,} header lines "
            "(server.max_header_bytes, server.max_headers)",
            "HeadersTooLarge",
        )

    def _overloaded(self) -> None:
        text = f"answers not yet taken by slow clients pass {self.limits.max_unsent_bytes:,} bytes (server.max_unsent_bytes); retry later"
        self._refuse(503, text, "Overloaded")

    def _check_read(self) -> None:
        self._read_timer = None
        if self._reading_since is None:
            return  # between requests: the next one arms it again
        due = self._reading_since + self.limits.read_timeout
        if self.loop.time() < due:  # a later request than the one it was armed for
            self._read_timer = self.loop.call_at(due, self._check_read)
            return
        if self.cycle is not None and self.cycle.response_started and not self._in_head:
            self.transport.close()  # answered already (say 413), the rest of its body never came
            return
        self._refuse(
            408, f"the request did not arrive whole within {self.limits.read_timeout:g} s (server.read_timeout_ms)", "RequestTimeout",
            linger=False,  # a client this slow is not sending much more
        )  # fmt: skip

    def _cancel_read_timer(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _refuse(self, status: int, message: str, kind: str, linger: bool = True) -> None:
        """Answer at the connection level, then close: lingering (see the module's docstring) where
        the client may still be sending."""
        if self._refused:
            return
        self._refused = True
        self._cancel_read_timer()
        self._unset_keepalive_if_required()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the application's receive() answers http.disconnect, its send() nothing
            self.cycle.message_event.set()
        transport = self.transport
        if transport.is_closing():
            return
        body = orjson.dumps({"error": message, "type": kind})
        head = b"content-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        transport.write(STATUS_LINE[status] + head + body)
        transport._flush()  # type: ignore[attr-defined]
        if linger and transport.can_write_eof():
            transport.write_eof()
            self.flow.resume_reading()
            self.loop.call_later(LINGER, transport.close)
        else:
            transport.close()
