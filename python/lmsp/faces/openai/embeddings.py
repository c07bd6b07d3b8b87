"""`POST /v1/embeddings`: OpenAI's request onto the embeddings service, its answer as OpenAI's
`list` of `embedding` objects (floats, or base64 of little-endian float32 as the SDK asks by
default)."""

from __future__ import annotations

import base64
import struct
from typing import Any

from ...protocol.errors import ProblemError
from ...service.embeddings import INPUT_SCHEMA, EmbeddingRequest, Embeddings, parse_inputs

__all__ = ["EMBEDDINGS_REQUEST", "embeddings_object", "translate_embeddings_request"]

_FIELDS = frozenset({"model", "input", "encoding_format", "dimensions", "user"})

# The request as the OpenAPI document shows it (checked by `translate_embeddings_request`).
EMBEDDINGS_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["model", "input"],
    "additionalProperties": False,
    "properties": {
        "model": {"type": "string"},
        "input": INPUT_SCHEMA,
        "encoding_format": {"enum": ["float", "base64"]},
        "dimensions": {"type": "integer", "description": "Only the model's own dimension: nothing is cut."},
        "user": {"type": "string"},
    },
}


def _refuse(param: str, detail: str) -> ProblemError:
    return ProblemError("invalid_request", detail, param=param)


def translate_embeddings_request(body: Any) -> tuple[EmbeddingRequest, str, int | None]:
    """The service's request, the encoding asked for, and the dimensions asked for (checked
    against the model's once it is known)."""
    if not isinstance(body, dict):
        raise _refuse("", "the body must be a JSON object")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise _refuse(unknown[0], f"unknown field {unknown[0]!r}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _refuse("model", "model is a model id (a string)")
    if "input" not in body:
        raise _refuse("input", "input is required")
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise _refuse("encoding_format", "encoding_format is float or base64")
    dimensions = body.get("dimensions")
    if dimensions is not None and (type(dimensions) is not int or dimensions < 1):
        raise _refuse("dimensions", "dimensions is a positive integer")
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise _refuse("user", "user is a string")
    return EmbeddingRequest(model, parse_inputs(body["input"])), encoding, dimensions


def check_dimensions(asked: int | None, embeddings: Embeddings) -> None:
    # The model's vectors are not trained to be cut short (Matryoshka): a shorter one would
    # not mean what the client expects, so only the model's own size is accepted.
    if asked is not None and asked != embeddings.dimensions:
        raise _refuse("dimensions", f"this model's embeddings have {embeddings.dimensions} dimensions, not {asked}")


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "float":
        return vector
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def embeddings_object(embeddings: Embeddings, encoding: str) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": _encode(vector, encoding)}
            for i, vector in enumerate(embeddings.vectors)
        ],
        "model": embeddings.model,
        "usage": {"prompt_tokens": embeddings.input_tokens, "total_tokens": embeddings.input_tokens},
    }
