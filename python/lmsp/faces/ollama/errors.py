"""Errors on `/api` in Ollama's shape: `{"error": "<message>"}` with the status Ollama answers
with (404 for a model it does not have, 400 for a bad request, 503 when it is busy; 429 for a
token past its own quota, as a proxy in front of Ollama would answer), so the
`ollama` libraries raise their `ResponseError` with that message and status. `param`, where
LMSP names the field at fault, rides along (Ollama's clients read `error` only)."""

from __future__ import annotations

from typing import Any

import orjson

from ...http.wire import LMSP_VERSION
from ...protocol.errors import ProblemError

__all__ = ["OLLAMA_ERROR", "error_body", "is_ollama_path", "ollama_status", "send_error"]

PREFIX = "/api/"

# Where Ollama answers differently from LMSP: a full queue is its 503 "server busy".
_STATUS = {"overloaded": 503, "too_many_streams": 503}

OLLAMA_ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}, "param": {"type": "string"}},
}


def is_ollama_path(path: str) -> bool:
    return path.startswith(PREFIX)


def ollama_status(error: ProblemError) -> int:
    return _STATUS.get(error.code, error.status)


def _param(param: str | None) -> str | None:
    # The service names the output's schema as the OpenAI request does; here it is `format`.
    if param is not None and param.startswith("response_format"):
        return "format"
    return param


def error_body(detail: str, param: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": detail}
    if param:
        body["param"] = param
    return body


def send_error(proto: Any, error: ProblemError) -> tuple[int, list[tuple[str, str]], bytes]:
    headers = [("content-type", "application/json; charset=utf-8"), ("lmsp-version", LMSP_VERSION), *error.headers]
    sent = (ollama_status(error), headers, orjson.dumps(error_body(error.detail, _param(error.param))))
    proto.response_bytes(*sent)
    return sent
