"""Feast's get-online-features request body (JSON) -> the reader's arguments."""

from __future__ import annotations

import json
from typing import Any

import orjson

from feature_reader.errors import RequestError, shown

FEAST_FIELDS = {"features", "feature_service", "entities", "full_feature_names"}
IGNORED = {"include_feature_view_version_metadata", "query_embedding", "query_string", "top_k", "api_version"}
"""Fields Feast's request model has that do not apply here: accepted, unused."""
OURS = {"max_age"}
"""The reader's own: a max_age in seconds for this request."""


_DIGITS = bytes(48 if 48 <= b <= 57 else 32 for b in range(256))
"""A body translated by it: every digit '0', every other byte a space."""
_LONG_NUMBER = b"0" * 19
"""19 digits in a row, which orjson may not keep: past 64 bits it makes a float of an integer
(2^64 became 1.8446744073709552e19), or fails; such a body is parsed again, exactly, by the
json module. Found by translate and a substring search: a tenth of a regular expression's
13 us on a 1 KB body."""


class _Long(int):
    """An integer literal longer than Python converts (4,300 digits): outside int64 whatever
    its value, shown by its digits."""

    def __new__(cls, digits: str):
        self = super().__new__(cls, -(2**64) if digits.startswith("-") else 2**64)
        self.digits = digits
        return self

    def __str__(self) -> str:
        return self.digits

    __repr__ = __str__


def _exact_int(digits: str) -> int:
    return int(digits) if len(digits) <= 4000 else _Long(digits)


def _not_json(name: str):
    raise ValueError(f"{name} is not JSON")  # the json module's extension; orjson refuses it too


def parse_body(body: bytes | str) -> dict[str, Any]:
    """Keyword arguments of get_online_features from a request body; RequestError naming the bad part."""
    raw = body.encode() if isinstance(body, str) else body
    try:
        exact = _LONG_NUMBER in raw.translate(_DIGITS)
        data = json.loads(raw, parse_int=_exact_int, parse_constant=_not_json) if exact else orjson.loads(raw)
    except ValueError as exc:  # orjson.JSONDecodeError and json.JSONDecodeError are ValueErrors
        raise RequestError(f"the request body is not JSON: {shown(str(exc), 200)}") from None
    except RecursionError:  # the json module's parse of a body nested past Python's recursion limit
        raise RequestError("the request body is not JSON: depth limit exceeded") from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object with 'features' (or 'feature_service') and 'entities'")
    unknown = sorted(set(data) - FEAST_FIELDS - IGNORED - OURS)
    if unknown:
        raise RequestError(
            f"unknown field(s) in the request: {', '.join(shown(u) for u in unknown[:10])}{' ...' * (len(unknown) > 10)} "
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
