"""Errors on the Anthropic face's paths in Anthropic's shape: `{"type": "error", "error":
{"type", "message"}}`, with the same HTTP status as the LMSP problem, so that the anthropic SDK
raises the class it raises for that status (BadRequestError, NotFoundError, …). The LMSP code
and the field at fault ride along as `error.code` and `error.param`."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic_core import core_schema as cs

from ...http.wire import LMSP_VERSION
from ...protocol.errors import CODES, ProblemError
from ...protocol.schema import field, literal, obj, text

__all__ = ["ANTHROPIC_ERROR", "error_object", "is_anthropic_path", "send_error"]

PATH = "/v1/messages"

# Anthropic's error `type` by HTTP status; any other 4xx is an invalid request.
_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
ERROR_TYPES = ("invalid_request_error", *dict.fromkeys(_TYPES.values()))

ANTHROPIC_ERROR = obj(
    {
        "type": field(literal("error")),
        "error": field(
            obj(
                {
                    "type": field(literal(*ERROR_TYPES)),
                    "message": field(text),
                    "code": field(cs.literal_schema(list(CODES)), required=False, doc="LMSP's code."),
                    "param": field(cs.nullable_schema(text), required=False, doc="The field at fault."),
                },
                "AnthropicErrorBody",
            )
        ),
    },
    "AnthropicError",
    doc="An Anthropic error object.",
)


def is_anthropic_path(path: str) -> bool:
    return path == PATH or path.startswith(PATH + "/")


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def error_object(problem: dict[str, Any]) -> dict[str, Any]:
    """An LMSP problem document as Anthropic's error body."""
    return {
        "type": "error",
        "error": {
            "type": error_type(problem["status"]),
            "message": problem["detail"],
            "code": problem["code"],
            "param": problem.get("param"),
        },
    }


def send_error(proto: Any, error: ProblemError) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = [("content-type", "application/json"), ("lmsp-version", LMSP_VERSION), *error.headers]
    sent = (error.status, headers, orjson.dumps(error_object(error.document())))
    proto.response_bytes(*sent)
    return sent
