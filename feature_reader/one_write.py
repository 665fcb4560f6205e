"""uvicorn's httptools protocol, writing each response in one send, with the bounds a
server facing hostile clients needs.

uvicorn writes a response's head and its body with two writes, and the event loop sends
each at once: two system calls and two TCP segments per response, and on loopback each
send costs about as much as the receiver's work on it. Here the writes of one turn of
the event loop go out together (head and body; the responses of pipelined requests too).

Bounds uvicorn does not have (``Limits``, from ``server:`` in conf):

- a request's head and body must arrive within ``read_timeout`` of its first byte (408,
  the connection closed): a client sending half a request holds nothing for long;
- a connection that sends no request at all is closed after ``idle_timeout``, as after a
  response (uvicorn arms its keep-alive timer only after a first response);
- the request head is at most ``max_header_bytes`` and ``max_headers`` lines (431):
  httptools buffers a header line whole before handing it over, with no limit;
- past ``max_connections`` open connections a new one is answered 503 and closed;
- at shutdown a request whose body is still coming is answered 503 and closed at once
  (it is not in flight: nothing was read for it yet).

Refusals are JSON bodies like the application's (``{"error": ..., "type": ...}``), then a
lingering close: the write side is shut, what the client still sends is read and
dropped for up to ``LINGER`` seconds, so the client reads the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httptools
import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from fm_config.reader import ServerSettings

LINGER = 2.0
"""Seconds a refused connection is read (and dropped) before it closes."""


@dataclass(frozen=True)
class Limits:
    """A connection's bounds (seconds, bytes, counts); from ``server:`` in conf."""

    read_timeout: float
    idle_timeout: float
    max_header_bytes: int
    max_headers: int
    max_connections: int

    @classmethod
    def from_settings(cls, server) -> Limits:
        return cls(
            read_timeout=server.read_timeout_ms / 1000, idle_timeout=server.idle_timeout_ms / 1000,
            max_header_bytes=server.max_header_bytes, max_headers=server.max_headers, max_connections=server.max_connections,
        )  # fmt: skip


class _Refused(Exception):
    """Raised in a parser callback to stop parsing; the answer is written already."""


class _OneWrite:
    """A connection's transport whose writes in one turn of the event loop go out as one."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        self._transport, self._loop = transport, loop
        self._queued: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._queued:
            self._loop.call_soon(self._flush)
        self._queued.append(data)

    def _flush(self) -> None:
        if self._queued:
            data = b"".join(self._queued)
            self._queued.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._flush()  # a response's last bytes, then the close
        self._transport.close()

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
        self._in_head = False
        self._head_raw = self._fed = 0
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_OneWrite(transport, self.loop))  # type: ignore[arg-type]
        if len(self.connections) > self.limits.max_connections:
            self._refuse(503, f"too many connections (server.max_connections {self.limits.max_connections:,}); retry later", "Overloaded")
            return
        # until its first request, as between requests: closed when idle
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive, self.timeout_keep_alive_handler)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_read_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # lingering: read and dropped
        self._unset_keepalive_if_required()
        self._fed = len(data)
        if self._in_head:  # a head begun in an earlier chunk: the parser holds these bytes until the line ends
            self._head_raw += self._fed
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError:
            if not self._refused:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
            return
        if self._in_head and self._head_raw > self.limits.max_header_bytes:
            self._too_large()  # still in the head after these bytes: all of them are the head's

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_raw = True, 0
        self._reading_since = now = self.loop.time()
        if self._read_timer is None:  # one timer per connection, re-armed when it fires: not one per request
            self._read_timer = self.loop.call_at(now + self.limits.read_timeout, self._check_read)

    def on_headers_complete(self) -> None:
        self._in_head = False
        limit = self.limits.max_header_bytes
        # the head is at most the bytes fed since it began (this chunk whole, earlier ones): only
        # a head that may pass the limit is measured (counting in on_header cost 1.3 us a request)
        if len(self.headers) > self.limits.max_headers or (
            self._head_raw + self._fed > limit and len(self.url) + sum(len(n) + len(v) + 4 for n, v in self.headers) > limit
        ):
            self._too_large()
            raise _Refused  # stops the parser: the application never sees it
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._reading_since = None
        super().on_message_complete()

    def shutdown(self) -> None:
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and cycle.more_body:
            self._refuse(503, "the server is stopping; retry on another", "ShuttingDown", linger=False)
        elif self._in_head:
            self.transport.close()  # a request whose head is still coming: nothing to answer yet
        else:
            super().shutdown()

    def _too_large(self) -> None:
        self._refuse(
            431,
            f"the request head passes {self.limits.max_header_bytes:,} bytes or {self.limits.max_headers:,} header lines "
            "(server.max_header_bytes, server.max_headers)",
            "HeadersTooLarge",
        )

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
