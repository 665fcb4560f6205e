# Candidate 6a: BlackSheep (served by uvicorn), orjson bytes response
import orjson
from blacksheep import Application, Content, Request, Response
from common import build_response

app = Application(show_error_details=False)


@app.router.post("/get-online-features")
async def gof(request: Request) -> Response:
    body = await request.read()
    out = orjson.dumps(build_response(orjson.loads(body)))
    return Response(200, None, Content(b"application/json", out))
