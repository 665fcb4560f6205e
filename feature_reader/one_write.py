"""uvicorn's httptools protocol, writing each response in one send.

uvicorn writes a response's head and its body with two writes, and the event loop sends
each at once: two system calls and two TCP segments per response, and on loopback each
send costs about as much as the receiver's work on it. Here the writes of one turn of
the event loop go out together (head and body; the responses of pipelined requests too).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


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
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_OneWrite(transport, self.loop))  # type: ignore[arg-type]
