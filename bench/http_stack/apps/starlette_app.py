# Candidate 3: Starlette Route + Request.body() + Response(orjson bytes)
import orjson
from common import build_response
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route


async def gof(request: Request) -> Response:
    body = await request.body()
    return Response(orjson.dumps(build_response(orjson.loads(body))), media_type="application/json")


app = Starlette(routes=[Route("/get-online-features", gof, methods=["POST"])])
