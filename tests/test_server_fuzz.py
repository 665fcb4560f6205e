"""The feature server's API fuzzed from the OpenAPI document it serves (schemathesis), against
a real `materialize serve` over the values the real job wrote: no answer is a 5xx, and every
answer (status, content type, body) is one the document describes. Bounded and repeatable:
a fixed number of examples per operation, derandomized."""

from __future__ import annotations

import copy
import json

import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .support.serving import serve, server_settings

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance, response_schema_conformance]
EXAMPLES = 60
"""Per operation and generation mode: about 700 requests in all."""


def _with_the_test_datas_names(document: dict) -> dict:
    """The served document, its request narrowed to names the test data has, so that most
    generated requests are served (200) and their bodies checked too, not only refused."""
    narrowed = copy.deepcopy(document)
    request = narrowed["components"]["schemas"]["GetOnlineFeaturesRequest"]
    request["properties"]["features"]["items"] = {"type": "string", "enum": ["every_type:n", "every_type:s", "every_type:e", "every_type"]}
    request["properties"]["features"].update(uniqueItems=True, minItems=1)
    request["properties"]["entities"] = {
        "type": "object",
        "required": ["consumer_id"],
        "additionalProperties": False,
        "properties": {
            "consumer_id": {"type": "array", "minItems": 1, "maxItems": 5, "items": {"type": "integer", "minimum": -5, "maximum": 9}}
        },
    }
    request["required"] = ["features", "entities"]
    for name in (
        "feature_service",
        "max_age",
        "include_feature_view_version_metadata",
        "query_embedding",
        "query_string",
        "top_k",
        "api_version",
    ):
        del request["properties"][name]
    return narrowed


def _fuzz(document: dict, base_url: str, modes: tuple) -> int:
    schema = schemathesis.openapi.from_dict(document)
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in modes:
            if mode == GenerationMode.NEGATIVE and operation.method.upper() != "POST":
                continue  # nothing to negate in a route without parameters or body

            @settings(
                max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )  # fmt: skip
            @given(operation.as_strategy(generation_mode=mode))
            def call(case):
                nonlocal calls
                calls += 1
                case.call_and_validate(base_url=base_url, checks=CHECKS, timeout=30)

            call()
    return calls


def test_no_5xx_and_every_answer_as_the_openapi_document_says(written_sample, tmp_path):
    conf, _ = written_sample
    server = serve(tmp_path, "fuzz", server_settings(conf))
    try:
        status, body = server.request("GET", "/openapi.json")
        assert status == 200
        document = json.loads(body)
        base_url = f"http://127.0.0.1:{server.port}"
        calls = _fuzz(document, base_url, (GenerationMode.POSITIVE, GenerationMode.NEGATIVE))
        narrowed = _with_the_test_datas_names(document)
        calls += _fuzz(
            {**narrowed, "paths": {"/get-online-features": narrowed["paths"]["/get-online-features"]}}, base_url, (GenerationMode.POSITIVE,)
        )
        assert calls >= 6 * EXAMPLES // 2, calls  # the operations were all exercised
        status, metrics = server.request("GET", "/metrics")
        served = [line for line in metrics.decode().splitlines() if line.startswith("feature_server_request_seconds_count")]
        assert any('status="200"' in line and "get-online-features" in line for line in served), served  # values, not only refusals
        assert not any('status="5' in line for line in served), served
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()
