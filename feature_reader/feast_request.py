"""Feast's get-online-features request body (JSON) -> the reader's arguments."""

from __future__ import annotations

from typing import Any

import orjson

from feature_reader.errors import RequestError

FEAST_FIELDS = {"features", "feature_service", "entities", "full_feature_names"}
IGNORED = {"include_feature_view_version_metadata", "query_embedding", "query_string", "top_k", "api_version"}
"""Fields Feast's request model has that do not apply here: accepted, unused."""
OURS = {"max_age"}
"""The reader's own: a max_age in seconds for this request."""


def parse_body(body: bytes | str) -> dict[str, Any]:
    """Keyword arguments of get_online_features from a request body; RequestError naming the bad part."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"the request body is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object with 'features' (or 'feature_service') and 'entities'")
    unknown = sorted(set(data) - FEAST_FIELDS - IGNORED - OURS)
    if unknown:
        raise RequestError(
            f"unknown field(s) in the request: {', '.join(unknown)} "
            "(expected: features or feature_service, entities, full_feature_names, max_age)"
        )
    features = data.get("features")
    if features is not None and not isinstance(features, list):  # its items: checked as the references resolve
        raise RequestError("'features' must be a list of strings like 'source:feature'")
    service = data.get("feature_service")
    if service is not None and not isinstance(service, str):
        raise RequestError("'feature_service' must be a string")
    full = data.get("full_feature_names", False)
    if not isinstance(full, bool):
        raise RequestError("'full_feature_names' must be true or false")
    if "entities" not in data:
        raise RequestError("the request has no 'entities' (key columns, e.g. {\"consumer_id\": [1, 2]})")
    return {
        "features": features,
        "entities": data["entities"],
        "feature_service": service,
        "full_feature_names": full,
        "max_age": data.get("max_age"),
    }
