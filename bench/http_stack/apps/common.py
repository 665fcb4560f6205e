"""Shared response builder: Feast /get-online-features response shape.

The response dict is built per request from Python lists (not a constant blob);
each app serializes it per request with its own JSON library.
"""

import random

_rng = random.Random(42)
# stand-in for values fetched from an online store (kept as python floats)
STORE_VALUES = [round(_rng.random(), 6) for _ in range(64)]
TS = "2026-11-21T00:00:00Z"
ENTITY_TS = "1970-01-01T00:00:00Z"


def build_response(req: dict) -> dict:
    features = req["features"]
    entities = req["entities"]
    ((ent_name, ent_vals),) = entities.items()
    n = len(ent_vals)
    results = [{"values": list(ent_vals), "statuses": ["PRESENT"] * n, "event_timestamps": [ENTITY_TS] * n}]
    names = [ent_name]
    for i, ref in enumerate(features):
        names.append(ref.split(":", 1)[-1])
        v = STORE_VALUES[i % 64]
        results.append({"values": [v] * n, "statuses": ["PRESENT"] * n, "event_timestamps": [TS] * n})
    return {"metadata": {"feature_names": names}, "results": results}
