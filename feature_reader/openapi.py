"""The OpenAPI 3 document of ``materialize serve`` (``GET /openapi.json``).

Written by hand beside the server it describes: every route, its methods, the request body
and every answer's body and status, precise enough for a conformance check
(tests/test_server_fuzz.py runs schemathesis against a real server with it). A route or an
answer added to server.py is added here too.
"""

from __future__ import annotations

import functools
from typing import Any

import orjson

ERROR_STATUSES = {
    "400": "Malformed JSON, a wrong field, a feature asked for twice, too many entities",
    "401": "No bearer token, or one that does not verify (server.auth; WWW-Authenticate says why)",
    "403": "The token's grants do not cover a source or feature service asked for (named)",
    "404": "An unknown feature, source or feature service (with near matches)",
    "408": "The request did not arrive whole within server.read_timeout_ms (the connection closes)",
    "413": "A body over server.max_body_bytes (the connection closes)",
    "415": "A body that is not declared JSON",
    "422": "Wrong or missing entity key columns, a key of the wrong type or outside int64",
    "431": "A request head over server.max_header_bytes or server.max_headers (the connection closes)",
    "503": "Overloaded (server.max_in_flight, server.max_connections, server.max_unsent_bytes), a store down, or stopping",
    "504": "No answer within server.deadline_ms or a store's reader.timeout_ms",
}
CONNECTION_STATUSES = ("408", "431", "503")
"""What any route may answer before the request reaches it (one_write.py)."""
STATUSES = ["PRESENT", "NOT_FOUND", "NULL_VALUE", "OUTSIDE_MAX_AGE", "INVALID", "STALE"]


def _error(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def _head(description: str) -> dict:
    """HEAD of a GET route: the GET's status and head, no body."""
    return {
        "summary": f"{description}: the head only",
        "responses": {
            "200": {"description": "As GET, without the body"},
            **{code: {"description": ERROR_STATUSES[code]} for code in CONNECTION_STATUSES},
        },
    }


PUSH_STATUSES = {
    "400": "Malformed JSON, a missing key or event time column, an unknown column, a value not fitting its type (row and column named)",
    "401": ERROR_STATUSES["401"],
    "403": "This server takes no pushes (server.push.enabled), or the token does not grant pushing to a source (named)",
    "404": "An unknown push source or feature view",
    "409": "A store holds one of the source's stored names as something else",
    "413": "A body over server.max_body_bytes, or rows over server.push.max_rows",
    "415": ERROR_STATUSES["415"],
    "501": "to: offline on a source table that cannot take an append without Spark (why named)",
    "502": "A store refused the write",
    "507": "A store is full",
    **{code: ERROR_STATUSES[code] for code in ("408", "431", "503")},
}


def _push(summary: str, schema: str) -> dict:
    return {
        "post": {
            "summary": summary,
            "requestBody": {"required": True, "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}},
            "responses": {
                "200": {
                    "description": "Written (the latest row per entity; a store's newer value kept)",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PushResponse"}}},
                },
                **{code: _error(text) for code, text in PUSH_STATUSES.items()},
            },
        }
    }


def _connection_errors() -> dict:
    return {code: _error(ERROR_STATUSES[code]) for code in CONNECTION_STATUSES}


def _ready() -> dict:
    """/health and /health/ready: readiness, the stores' check."""
    return {
        "get": {
            "summary": "Whether every configured store answers",
            "responses": {
                "200": {
                    "description": "Every store answers",
                    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Health"}}},
                },
                "503": {
                    "description": "A store does not answer (named), or overloaded",
                    "content": {
                        "application/json": {
                            "schema": {"oneOf": [{"$ref": "#/components/schemas/Health"}, {"$ref": "#/components/schemas/Error"}]}
                        }
                    },
                },
                **{code: _error(ERROR_STATUSES[code]) for code in ("408", "431")},
            },
        },
        "head": _head("Whether every configured store answers"),
    }


SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "required": ["error", "type"],
        "additionalProperties": False,
        "properties": {
            "error": {
                "type": "string",
                "maxLength": 4096,
                "description": "What was wrong, naming the bad part (names cut to 100 characters)",
            },
            "type": {"type": "string", "maxLength": 64, "description": "The kind of error, e.g. UnknownNameError, EntityKeyError"},
        },
    },
    "GetOnlineFeaturesRequest": {
        "type": "object",
        "description": "Feast's get-online-features request body; max_age is this server's own",
        "required": ["entities"],
        "additionalProperties": False,
        "properties": {
            "features": {
                "type": "array",
                "items": {"type": "string"},
                "description": "'source:feature' or a source's name (all its features); each feature once",
            },
            "feature_service": {"type": "string", "description": "A feature service's name (instead of features)"},
            "entities": {
                "type": "object",
                "minProperties": 1,
                "description": "Every key column the features need, each a list of the same length",
                "additionalProperties": {
                    "type": "array",
                    "minItems": 1,
                    "items": {"oneOf": [{"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1}, {"type": "string"}]},
                },
            },
            "full_feature_names": {"type": "boolean", "description": "Columns named source__feature"},
            "max_age": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "description": "Seconds; older values are withheld"},
            **{
                name: {"description": "Feast's; accepted, not used"}
                for name in ("include_feature_view_version_metadata", "query_embedding", "query_string", "top_k", "api_version")
            },
        },
    },
    "GetOnlineFeaturesResponse": {
        "type": "object",
        "required": ["results", "metadata"],
        "additionalProperties": False,
        "properties": {
            "metadata": {
                "type": "object",
                "required": ["feature_names"],
                "additionalProperties": False,
                "properties": {
                    "feature_names": {"type": "array", "items": {"type": "string"}, "description": "Key columns, then features"}
                },
            },
            "results": {
                "type": "array",
                "description": "One per feature_names entry, in order; each list has one item per entity",
                "items": {
                    "type": "object",
                    "required": ["values", "statuses", "event_timestamps"],
                    "additionalProperties": False,
                    "properties": {
                        "values": {"type": "array", "items": {}},
                        "statuses": {"type": "array", "items": {"type": "string", "enum": STATUSES}},
                        "event_timestamps": {"type": "array", "items": {"type": "string", "format": "date-time"}},
                    },
                },
            },
        },
    },
    "PushRequest": {
        "type": "object",
        "required": ["push_source_name", "df"],
        "properties": {
            "push_source_name": {"type": "string", "description": "Every source whose push_source is this name is written"},
            "df": {"$ref": "#/components/schemas/Columns"},
            "to": {"type": "string", "enum": ["online", "offline", "online_and_offline"], "default": "online"},
            "allow_registry_cache": {"type": "boolean", "description": "Accepted, ignored (Feast's)"},
            "transform_on_write": {"type": "boolean", "description": "Accepted, ignored (Feast's)"},
        },
    },
    "WriteToOnlineStoreRequest": {
        "type": "object",
        "required": ["feature_view_name", "df"],
        "properties": {
            "feature_view_name": {"type": "string", "description": "The source written"},
            "df": {"$ref": "#/components/schemas/Columns"},
            "allow_registry_cache": {"type": "boolean", "description": "Accepted, ignored (Feast's)"},
        },
    },
    "Columns": {
        "type": "object",
        "description": "Column name -> values, one per row: entity keys, event time, created time, features",
        "additionalProperties": {"type": "array", "items": {}},
    },
    "PushResponse": {
        "type": "object",
        "required": ["status", "rows", "written"],
        "properties": {
            "status": {"type": "string", "enum": ["ok"]},
            "rows": {"type": "integer"},
            "written": {"type": "object", "description": "Per source and store: written, kept_newer, replaced_future"},
            "offline": {"type": "object", "description": "Per source table appended to: rows appended"},
        },
    },
    "Live": {"type": "object", "required": ["status"], "properties": {"status": {"type": "string", "enum": ["alive"]}}},
    "Health": {
        "type": "object",
        "required": ["status", "stores"],
        "properties": {
            "status": {"type": "string", "enum": ["ready", "unavailable"]},
            "stores": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "Per store: ok, or why not (with server.auth only to a caller whose token verifies; others: unavailable)",
            },
        },
    },
}


def document() -> dict[str, Any]:
    json_body = {"application/json": {"schema": {"$ref": "#/components/schemas/GetOnlineFeaturesRequest"}}}
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "feature-materializer feature server",
            "version": "1",
            "description": "Feast's feature-server HTTP API (materialize serve); errors are JSON {error, type}.",
        },
        "paths": {
            "/get-online-features": {
                "post": {
                    "summary": "Feature values of entities, in Feast's response shape",
                    "requestBody": {"required": True, "content": json_body},
                    "responses": {
                        "200": {
                            "description": "Values, statuses and as-of times, per feature, per entity",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/GetOnlineFeaturesResponse"}}},
                        },
                        **{code: _error(text) for code, text in ERROR_STATUSES.items()},
                    },
                }
            },
            "/push": _push("Feast's push: rows of the sources that take this push source's pushes", "PushRequest"),
            "/write-to-online-store": _push("Feast's write to the online store: rows of one source", "WriteToOnlineStoreRequest"),
            **{route: _ready() for route in ("/health", "/health/ready")},
            "/health/live": {
                "get": {
                    "summary": "Liveness: the process answers, whatever the stores",
                    "responses": {
                        "200": {"description": "Alive", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Live"}}}},
                        **_connection_errors(),
                    },
                },
                "head": _head("Liveness"),
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics (text exposition format 0.0.4)",
                    "responses": {
                        "200": {"description": "Metrics", "content": {"text/plain": {"schema": {"type": "string"}}}},
                        **_connection_errors(),
                        "401": _error("No or a bad bearer token, when server.auth.metrics is authenticated"),
                    },
                },
                "head": _head("Prometheus metrics"),
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "responses": {
                        "200": {"description": "OpenAPI 3", "content": {"application/json": {"schema": {"type": "object"}}}},
                        **_connection_errors(),
                    },
                },
                "head": _head("This document"),
            },
        },
        "components": {"schemas": SCHEMAS},
    }


@functools.cache
def openapi_json() -> bytes:
    return orjson.dumps(document())
