# Candidate 6c: socketify native API (uWebSockets.py) + orjson
import sys

import orjson
from common import build_response
from socketify import App, AppListenOptions

PORT = int(sys.argv[1]) if len(sys.argv) > 1 else 8006


async def gof(res, req):
    body = await res.get_data()  # BytesIO
    out = orjson.dumps(build_response(orjson.loads(body.getvalue())))
    res.write_header("Content-Type", "application/json")
    res.end(out)


app = App()
app.post("/get-online-features", gof)
app.listen(AppListenOptions(port=PORT, host="127.0.0.1"), lambda cfg: print("listening", cfg.port, flush=True))
app.run()
