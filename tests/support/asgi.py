"""The feature server's ASGI app called in process: one request, its status and body."""

from __future__ import annotations

import asyncio

JSON = [(b"content-type", b"application/json")]


async def asgi_request(app, method: str, path: str, body: bytes = b"", headers: list | None = None) -> tuple[int, bytes]:
    """One request to ``app`` on the running event loop (calls sharing the app's reader share one loop)."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    await app({"type": "http", "method": method, "path": path, "headers": headers or []}, receive, send)
    return sent[0]["status"], sent[1]["body"]


def asgi_call(app, method: str, path: str, body: bytes = b"", headers: list | None = None, close: bool = True) -> tuple[int, bytes]:
    """One request to ``app`` (a FeatureServer) on an event loop of its own; its reader is closed afterwards unless ``close`` is false."""

    async def call():
        try:
            return await asgi_request(app, method, path, body, headers)
        finally:
            if close:
                await app.reader.close()

    return asyncio.run(call())


def asgi_post(app, body: bytes) -> tuple[int, bytes]:
    """A JSON POST of ``body`` to /get-online-features."""
    return asgi_call(app, "POST", "/get-online-features", body, JSON)
