"""The Anthropic face's operations in the OpenAPI document: request bodies from the face's
pydantic-core schemas, errors as Anthropic error objects."""

from __future__ import annotations

from typing import Any

from pydantic_core import core_schema as cs

from .errors import ANTHROPIC_ERROR
from .schema import COUNT_TOKENS_REQUEST, MESSAGES_REQUEST

__all__ = ["SCHEMAS", "anthropic_paths"]

# Components the operations refer to (added to the document's by protocol/openapi.py).
SCHEMAS: list[tuple[str, cs.CoreSchema]] = [
    ("anthropic_messages_request", MESSAGES_REQUEST),
    ("anthropic_count_tokens_request", COUNT_TOKENS_REQUEST),
    ("anthropic_error", ANTHROPIC_ERROR),
]


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(*statuses: int) -> dict[str, Any]:
    return {
        str(status): {
            "description": "An Anthropic error object.",
            "content": {"application/json": {"schema": _ref("AnthropicError")}},
        }
        for status in sorted({*statuses, 401, 403})
    }


_MESSAGE = {
    "type": "object",
    "properties": {"type": {"const": "message"}, "id": {"type": "string"}, "content": {"type": "array"}},
    "required": ["type", "id", "content", "stop_reason", "usage"],
}
_SSE = {
    "text/event-stream": {
        "schema": {
            "type": "object",
            "description": (
                "Anthropic's Messages stream: message_start, then per content block content_block_start, "
                "content_block_delta (text_delta, input_json_delta, thinking_delta) and content_block_stop, "
                "then message_delta and message_stop; `ping` while nothing else comes; `error` on a failure."
            ),
            "properties": {"event": {"type": "string"}, "data": {"type": "string"}},
            "required": ["event", "data"],
        }
    }
}


def anthropic_paths(version: dict[str, Any], idempotency: dict[str, Any]) -> dict[str, Any]:
    """`version`: the LMSP-Version header parameter, which these routes check as every route
    does; `idempotency`: the Idempotency-Key one, which creating a message honours."""
    return {
        "/v1/messages": {
            "post": {
                "operationId": "anthropicCreateMessage",
                "parameters": [version, idempotency],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("AnthropicMessagesRequest")}},
                },
                "responses": {
                    "200": {
                        "description": "The message, or its event stream (`stream: true`).",
                        "content": {"application/json": {"schema": _MESSAGE}, **_SSE},
                    },
                    **_errors(400, 404, 408, 409, 413, 415, 422, 429, 500, 503),
                },
            }
        },
        "/v1/messages/count_tokens": {
            "post": {
                "operationId": "anthropicCountTokens",
                "parameters": [version],
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": _ref("AnthropicCountTokensRequest")}},
                },
                "responses": {
                    "200": {
                        "description": "The prompt's tokens on the model, tools and system prompt included.",
                        "content": {
                            "application/json": {
                                "schema": {
                                    "type": "object",
                                    "properties": {"input_tokens": {"type": "integer"}},
                                    "required": ["input_tokens"],
                                }
                            }
                        },
                    },
                    **_errors(400, 404, 413, 415, 429, 500),
                },
            }
        },
    }
