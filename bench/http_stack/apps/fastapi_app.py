# Candidate 4: FastAPI with pydantic request model and default JSON response
from typing import Any

from common import build_response
from fastapi import FastAPI
from pydantic import BaseModel


class GetOnlineFeaturesRequest(BaseModel):
    features: list[str]
    entities: dict[str, list[Any]]
    full_feature_names: bool = False


app = FastAPI()


@app.post("/get-online-features")
async def gof(req: GetOnlineFeaturesRequest):
    return build_response({"features": req.features, "entities": req.entities})
