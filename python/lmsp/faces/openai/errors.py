"""Errors on `/v1` as OpenAI error objects: `{"error": {"message", "type", "param", "code"}}`,
with the LMSP code as `code` and the same HTTP status, so that an OpenAI SDK raises the class
it raises for that status (BadRequestError, NotFoundError, RateLimitError, …)."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic_core import core_schema as cs

from ...http.wire import LMSP_VERSION
from ...protocol.errors import CODES, ProblemError
from ...protocol.schema import field, obj, text

__all__ = ["OPENAI_ERROR", "error_object", "is_openai_path", "send_error"]

PREFIX = "/v1/"

# OpenAI's `type` by status; the code says what exactly.
_TYPES = {401: "authentication_error", 403: "permission_error", 429: "rate_limit_error"}

OPENAI_ERROR = obj(
    {
        "error": field(
            obj(
                {
                    "message": field(text),
                    "type": field(text),
                    "param": field(cs.nullable_schema(text)),
                    "code": field(cs.literal_schema(list(CODES))),
                },
                "OpenAIErrorBody",
            )
        )
    },
    "OpenAIError",
    doc="An OpenAI error object.",
)


def is_openai_path(path: str) -> bool:
    return path.startswith(PREFIX)


def _type(status: int) -> str:
    return "server_error" if status >= 500 else _TYPES.get(status, "invalid_request_error")


def error_object(problem: dict[str, Any]) -> dict[str, Any]:
    """An LMSP problem document as the OpenAI error body."""
    return {
        "error": {
            "message": problem["detail"],
            "type": _type(problem["status"]),
            "param": problem.get("param"),
            "code": problem["code"],
        }
    }


def send_error(proto: Any, error: ProblemError) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = [("content-type", "application/json"), ("lmsp-version", LMSP_VERSION), *error.headers]
    sent = (error.status, headers, orjson.dumps(error_object(error.document())))
    proto.response_bytes(*sent)
    return sent
