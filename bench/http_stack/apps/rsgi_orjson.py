# Candidate 6b: granian native RSGI interface + orjson
import orjson
from common import build_response

_HDRS = [("content-type", "application/json")]


async def app(scope, proto):
    if scope.path != "/get-online-features" or scope.method != "POST":
        proto.response_empty(404, [])
        return
    body = await proto()
    proto.response_bytes(200, _HDRS, orjson.dumps(build_response(orjson.loads(body))))
