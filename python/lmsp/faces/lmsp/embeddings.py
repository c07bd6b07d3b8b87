"""`POST /lmsp/v1/embeddings`, an extension of LMSP 1.0 (PROFILE.md, "Extensions"): the
request onto the embeddings service, the answer in LMSP's own shape."""

from __future__ import annotations

from typing import Any

from ...protocol.errors import ProblemError
from ...service.embeddings import INPUT_SCHEMA, EmbeddingRequest, Embeddings, parse_inputs

__all__ = ["embeddings_body", "embeddings_paths", "translate_embeddings"]

_FIELDS = frozenset({"model", "input", "truncate"})

_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "string"},
        "input": INPUT_SCHEMA,
        "truncate": {
            "type": "boolean",
            "default": False,
            "description": "An input over the model's embedding window is cut to it (else: 400).",
        },
    },
}

_RESPONSE: dict[str, Any] = {
    "type": "object",
    "required": ["object", "model", "dimensions", "data", "usage"],
    "properties": {
        "object": {"const": "embeddings"},
        "model": {"type": "string"},
        "dimensions": {"type": "integer"},
        "data": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["index", "embedding"],
                "properties": {
                    "index": {"type": "integer"},
                    "embedding": {"type": "array", "items": {"type": "number"}},
                },
            },
        },
        "usage": {"type": "object", "properties": {"input_tokens": {"type": "integer"}}},
    },
}


def translate_embeddings(body: Any) -> EmbeddingRequest:
    if not isinstance(body, dict):
        raise ProblemError("invalid_request", "the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ProblemError("invalid_request", f"unknown field {unknown[0]!r}", param=unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ProblemError("invalid_request", "model is a model id (a string)", param="model")
    if "input" not in body:
        raise ProblemError("invalid_request", "input is required", param="input")
    truncate = body.get("truncate", False)
    if not isinstance(truncate, bool):
        raise ProblemError("invalid_request", "truncate is true or false", param="truncate")
    return EmbeddingRequest(model, parse_inputs(body["input"]), truncate=truncate)


def embeddings_body(embeddings: Embeddings) -> dict[str, Any]:
    return {
        "object": "embeddings",
        "model": embeddings.model,
        "dimensions": embeddings.dimensions,
        "data": [{"index": i, "embedding": vector} for i, vector in enumerate(embeddings.vectors)],
        "usage": {"input_tokens": embeddings.input_tokens},
    }


def _problems(*statuses: int) -> dict[str, Any]:
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    return {str(status): {"description": "A problem document.", "content": problem} for status in statuses}


def embeddings_paths(version: dict[str, Any]) -> dict[str, Any]:
    return {
        "/lmsp/v1/embeddings": {
            "post": {
                "operationId": "createEmbeddings",
                "summary": "Embeddings of texts by a model (an LMSP extension).",
                "parameters": [version],
                "requestBody": {"required": True, "content": {"application/json": {"schema": _REQUEST}}},
                "responses": {
                    "200": {
                        "description": "One vector of unit length per input, in input order.",
                        "content": {"application/json": {"schema": _RESPONSE}},
                    },
                    **_problems(400, 401, 403, 404, 408, 413, 415, 429, 500, 503),
                },
            }
        }
    }
