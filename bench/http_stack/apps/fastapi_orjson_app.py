# Variant 4b: FastAPI with pydantic request model, but returns Response(orjson bytes)
from typing import Any

import orjson
from common import build_response
from fastapi import FastAPI
from fastapi.responses import Response
from pydantic import BaseModel


class GetOnlineFeaturesRequest(BaseModel):
    features: list[str]
    entities: dict[str, list[Any]]
    full_feature_names: bool = False


app = FastAPI()


@app.post("/get-online-features")
async def gof(req: GetOnlineFeaturesRequest):
    return Response(orjson.dumps(build_response({"features": req.features, "entities": req.entities})), media_type="application/json")
