# Candidate 1/5: raw ASGI app + orjson (served by uvicorn or granian)
import orjson
from common import build_response

_HDRS = [(b"content-type", b"application/json")]
_404 = {"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]}


async def app(scope, receive, send):
    if scope["type"] != "http":
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        return
    if scope["path"] != "/get-online-features" or scope["method"] != "POST":
        await send(_404)
        await send({"type": "http.response.body", "body": b""})
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    out = orjson.dumps(build_response(orjson.loads(body)))
    await send({"type": "http.response.start", "status": 200, "headers": _HDRS + [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})
