"""The feature server's ASGI app called in process: one request, its status and body."""

from __future__ import annotations

import asyncio


def asgi_call(app, method: str, path: str, body: bytes = b"", headers: list | None = None, close: bool = True) -> tuple[int, bytes]:
    """One request to ``app`` (a FeatureServer); its reader is closed afterwards unless ``close`` is false."""
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    async def call():
        await app({"type": "http", "method": method, "path": path, "headers": headers or []}, receive, send)
        if close:
            await app.reader.close()

    asyncio.run(call())
    return sent[0]["status"], sent[1]["body"]


def asgi_post(app, body: bytes) -> tuple[int, bytes]:
    """A JSON POST of ``body`` to /get-online-features."""
    return asgi_call(app, "POST", "/get-online-features", body, [(b"content-type", b"application/json")])
