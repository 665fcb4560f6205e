# Candidate 4: FastAPI with pydantic request model and default JSON response
from typing import Any, Dict, List
from fastapi import FastAPI
from pydantic import BaseModel
from common import build_response


class GetOnlineFeaturesRequest(BaseModel):
    features: List[str]
    entities: Dict[str, List[Any]]
    full_feature_names: bool = False


app = FastAPI()


@app.post("/get-online-features")
async def gof(req: GetOnlineFeaturesRequest):
    return build_response({"features": req.features, "entities": req.entities})
