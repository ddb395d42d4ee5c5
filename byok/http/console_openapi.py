"""The control API's OpenAPI 3.1 document, built from the route table (each handler's docstring
or name is its summary) and the bodies the entries accept."""

from __future__ import annotations

from typing import Any

from byok.config import PROVIDER_KINDS
from byok.console.entries import EFFORTS, ID_PATTERN
from byok.http.console_routes import ROUTES

_ID = {"type": "string", "pattern": f"^{ID_PATTERN.pattern}$"}
_SCHEMAS: dict[str, Any] = {
    "Error": {
        "type": "object",
        "properties": {
            "error": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                "required": ["field", "message"],
            }
        },
    },
    "ProviderBody": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "id": _ID,
            "kind": {"enum": list(PROVIDER_KINDS)},
            "base_url": {"type": "string", "format": "uri"},
            "api_key": {"type": ["string", "null"], "writeOnly": True, "description": "shown as its last 4"},
            "headers": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
            "enabled": {"type": "boolean"},
        },
        "required": ["id", "kind", "base_url"],
    },
    "ModelBody": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "id": _ID,
            "provider": _ID,
            "upstream_model": {"type": "string"},
            "context_tokens": {"type": "integer", "minimum": 1},
            "display_name": {"type": ["string", "null"]},
            "max_output_tokens": {"type": ["integer", "null"], "minimum": 1},
            "thinking": {"type": "boolean"},
            "effort": {"enum": [*EFFORTS, None]},
            "vision": {"type": "boolean"},
            "enabled": {"type": "boolean"},
            "position": {"type": "integer", "minimum": 0, "description": "order in Cursor's picker"},
            "extra_body": {"type": ["object", "null"]},
        },
        "required": ["id", "provider", "upstream_model", "context_tokens"],
    },
    "AliasBody": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "id": _ID,
            "targets": {"type": "array", "items": _ID, "minItems": 1, "maxItems": 8},
            "display_name": {"type": ["string", "null"]},
            "first_token_timeout_s": {"type": "number", "exclusiveMinimum": 0},
            "cooldown_s": {"type": "number", "exclusiveMinimum": 0},
            "enabled": {"type": "boolean"},
            "position": {"type": "integer", "minimum": 0},
        },
        "required": ["id", "targets"],
    },
}
_BODIES = {
    ("POST", "/providers"): "ProviderBody",
    ("PATCH", "/providers/{id}"): "ProviderBody",
    ("POST", "/models"): "ModelBody",
    ("PATCH", "/models/{id}"): "ModelBody",
    ("POST", "/aliases"): "AliasBody",
    ("PATCH", "/aliases/{id}"): "AliasBody",
}
_ERROR = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


def openapi_document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for r in ROUTES:
        doc = (r.handler.__doc__ or r.handler.__name__.replace("_", " ")).strip().split("\n\n")[0]
        op: dict[str, Any] = {
            "operationId": r.handler.__name__,
            "summary": " ".join(doc.split()),
            "responses": {"2XX": {"description": "JSON"}, "4XX": {"description": "error", **_ERROR}},
        }
        if "{id}" in r.pattern:
            op["parameters"] = [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}]
        body = _BODIES.get((r.method, r.pattern))
        if body is not None:
            schema = {"$ref": f"#/components/schemas/{body}"}
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
        paths.setdefault("/byok/api" + r.pattern, {})[r.method.lower()] = op
    paths["/byok/api/calls/live"] = {
        "get": {
            "operationId": "live_calls",
            "summary": "Each provider call as it is recorded (server-sent events, event: call)",
            "responses": {"200": {"description": "text/event-stream"}},
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "byok control API", "version": "1"},
        "components": {
            "schemas": _SCHEMAS,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"token": []}],
        "paths": paths,
    }
