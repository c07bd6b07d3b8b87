"""The `/v1` operations of the OpenAPI document: request bodies from the face's pydantic-core
schemas, errors as OpenAI error objects."""

from __future__ import annotations

from typing import Any

from pydantic_core import core_schema as cs

from .embeddings import EMBEDDINGS_REQUEST
from .errors import OPENAI_ERROR
from .schema import CHAT_REQUEST, RESPONSES_REQUEST

__all__ = ["SCHEMAS", "openai_paths"]

# Components the /v1 operations refer to (added to the document's by protocol/openapi.py).
SCHEMAS: list[tuple[str, cs.CoreSchema]] = [
    ("openai_responses_request", RESPONSES_REQUEST),
    ("openai_chat_request", CHAT_REQUEST),
    ("openai_error", OPENAI_ERROR),
]

_REF = "#/components/schemas/{}"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": _REF.format(name)}


def _errors(*statuses: int) -> dict[str, Any]:
    return {
        str(status): {
            "description": "An OpenAI error object.",
            "content": {"application/json": {"schema": _ref("OpenAIError")}},
        }
        for status in sorted({*statuses, 401, 403})
    }


def _object(kind: str, *required: str) -> dict[str, Any]:
    return {"type": "object", "properties": {"object": {"const": kind}}, "required": ["object", *required]}


_RESPONSE = _object("response", "id", "status", "output", "model", "created_at")
_SSE = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "description": (
                "OpenAI Responses stream events: `event` is the type, `data` its JSON with `type` and a "
                "`sequence_number` (1, 2, …); one of response.completed, response.incomplete, "
                "response.failed (or `error`) ends it."
            ),
            "properties": {"id": {"type": "string"}, "event": {"type": "string"}, "data": {"type": "string"}},
            "required": ["data"],
        }
    }
}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _path_param(name: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}


def openai_paths(version: dict[str, Any], idempotency: dict[str, Any]) -> dict[str, Any]:
    """`version`: the LMSP-Version header parameter, which /v1 checks as every route does;
    `idempotency`: the Idempotency-Key one, which its creating POSTs honour as LMSP's do."""
    response_id = _path_param("response_id")
    return {
        "/v1/models": {
            "get": {
                "operationId": "openaiListModels",
                "parameters": [version],
                "responses": {
                    "200": _json("The models (OpenAI model objects).", _object("list", "data")),
                    **_errors(400),
                },
            }
        },
        "/v1/models/{model_id}": {
            "get": {
                "operationId": "openaiGetModel",
                "parameters": [_path_param("model_id"), version],
                "responses": {"200": _json("A model.", _object("model", "id")), **_errors(400, 404)},
            }
        },
        "/v1/responses": {
            "post": {
                "operationId": "openaiCreateResponse",
                "parameters": [version, idempotency],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("OpenAIResponseRequest")}},
                },
                "responses": {
                    "200": {
                        "description": "The response object (in progress when `background`), or its event stream.",
                        "content": {"application/json": {"schema": _RESPONSE}, **_SSE},
                    },
                    **_errors(400, 404, 408, 409, 413, 415, 422, 429, 500, 503),
                },
            }
        },
        "/v1/responses/{response_id}": {
            "get": {
                "operationId": "openaiGetResponse",
                "parameters": [
                    response_id,
                    version,
                    {
                        "name": "stream",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": ["true", "false"]},
                    },
                    {
                        "name": "starting_after",
                        "in": "query",
                        "required": False,
                        "description": "With stream=true: the events after this sequence number.",
                        "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"},
                    },
                ],
                "responses": {
                    "200": {
                        "description": "The response, or its events.",
                        "content": {"application/json": {"schema": _RESPONSE}, **_SSE},
                    },
                    **_errors(400, 404, 410, 429),
                },
            },
            "delete": {
                "operationId": "openaiDeleteResponse",
                "parameters": [response_id, version],
                "responses": {"200": _json("Deleted.", _object("response", "id", "deleted")), **_errors(400, 404, 409)},
            },
        },
        "/v1/responses/{response_id}/cancel": {
            "post": {
                "operationId": "openaiCancelResponse",
                "parameters": [response_id, version],
                "responses": {
                    "200": _json("The response, cancelled if it was running in the background.", _RESPONSE),
                    **_errors(400, 404),
                },
            }
        },
        "/v1/responses/{response_id}/input_items": {
            "get": {
                "operationId": "openaiListInputItems",
                "parameters": [
                    response_id,
                    version,
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "minimum": 1, "maximum": 100},
                    },
                    {
                        "name": "order",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string", "enum": ["asc", "desc"]},
                    },
                    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"}},
                ],
                "responses": {
                    "200": _json("The input items, history included.", _object("list", "data")),
                    **_errors(400, 404),
                },
            }
        },
        "/v1/chat/completions": {
            "post": {
                "operationId": "openaiCreateChatCompletion",
                "parameters": [version, idempotency],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("OpenAIChatRequest")}},
                },
                "responses": {
                    "200": {
                        "description": (
                            "A chat.completion, or its chat.completion.chunk stream ending with `data: [DONE]`."
                        ),
                        "content": {
                            "application/json": {"schema": _object("chat.completion", "id", "choices")},
                            "text/event-stream": {
                                "schema": {"type": "object", "properties": {"data": {"type": "string"}}}
                            },
                        },
                    },
                    **_errors(400, 404, 408, 409, 413, 415, 422, 429, 500, 503),
                },
            }
        },
        "/v1/embeddings": {
            "post": {
                "operationId": "openaiCreateEmbeddings",
                "parameters": [version],
                "requestBody": {"required": True, "content": {"application/json": {"schema": EMBEDDINGS_REQUEST}}},
                "responses": {
                    "200": _json(
                        "One embedding object per input, in input order (floats, or base64 of little-endian float32).",
                        _object("list", "data", "model", "usage"),
                    ),
                    **_errors(400, 404, 408, 413, 415, 429, 500, 503),
                },
            }
        },
    }
