"""Problem documents (RFC 9457) and the LMSP error codes this service emits."""

from __future__ import annotations

from typing import Any

import orjson
from pydantic_core import core_schema as cs

from .schema import field, obj, text

__all__ = ["CODES", "PROBLEM", "ProblemError", "draining", "problem", "unavailable"]

# code → (HTTP status, title). The one table of what the service can say went wrong.
CODES: dict[str, tuple[int, str]] = {
    "invalid_json": (400, "Malformed JSON"),
    "invalid_request": (400, "Invalid request"),
    "unsupported_content_type": (400, "Unsupported content type"),
    "unsupported_capability": (400, "Unsupported capability"),
    "unsupported_schema": (400, "Unsupported schema"),
    "context_length_exceeded": (400, "Context length exceeded"),
    "unsupported_version": (400, "Unsupported LMSP version"),
    "limit_exceeded": (400, "Limit exceeded"),
    "authentication_required": (401, "Authentication required"),
    "invalid_token": (401, "Invalid token"),
    "insufficient_scope": (403, "Insufficient scope"),
    "host_not_allowed": (403, "Host not allowed"),
    "origin_not_allowed": (403, "Origin not allowed"),
    "not_found": (404, "Not found"),
    "model_not_found": (404, "Model not found"),
    "response_not_found": (404, "Response not found"),
    "task_not_found": (404, "Task not found"),
    "method_not_allowed": (405, "Method not allowed"),
    "idempotency_conflict": (409, "Idempotency conflict"),
    "request_timeout": (408, "Request timeout"),
    "event_history_expired": (410, "Event history expired"),
    "request_too_large": (413, "Request too large"),
    "unsupported_media_type": (415, "Unsupported media type"),
    "idempotency_key_reused": (422, "Idempotency key reused"),
    "overloaded": (429, "Overloaded"),
    "too_many_streams": (429, "Too many streams"),
    "rate_limit_exceeded": (429, "Rate limit exceeded"),
    "generation_failed": (500, "Generation failed"),
    "storage_failed": (500, "Storage failed"),
    "internal_error": (500, "Internal error"),
    "model_unavailable": (503, "Model unavailable"),
    "service_unavailable": (503, "Service unavailable"),
}

PROBLEM = obj(
    {
        "type": field(cs.str_schema(strict=True, pattern="^urn:lmsp:error:[a-z_]+$"), doc="`urn:lmsp:error:<code>`"),
        "title": field(text),
        "status": field(cs.int_schema(strict=True, ge=400, le=599), doc="The HTTP status it came with."),
        "detail": field(text),
        "code": field(cs.literal_schema(list(CODES))),
        "param": field(text, required=False, doc="The JSON path of the offending field, or the header's name."),
    },
    "Problem",
    doc="An RFC 9457 problem document (`application/problem+json`).",
)


def problem(code: str, detail: str, param: str | None = None) -> dict[str, Any]:
    status, title = CODES[code]
    doc: dict[str, Any] = {
        "type": f"urn:lmsp:error:{code}",
        "title": title,
        "status": status,
        "detail": detail,
        "code": code,
    }
    if param is not None:
        doc["param"] = param
    return doc


class ProblemError(Exception):
    """Raised anywhere below the HTTP layer; the HTTP layer turns it into a problem response."""

    def __init__(
        self,
        code: str,
        detail: str,
        param: str | None = None,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.param = param
        self.headers = headers or []

    @property
    def status(self) -> int:
        return CODES[self.code][0]

    def document(self) -> dict[str, Any]:
        return problem(self.code, self.detail, self.param)

    def body(self) -> bytes:
        return orjson.dumps(self.document())


def unavailable(what: str, retry_after: int = 2) -> ProblemError:
    """503 for a shared server (`what`: "the shared store") that did not answer in time. Says
    which part, never where it is: no host, port, user or database name reaches a client."""
    return ProblemError(
        "service_unavailable",
        f"{what} did not answer in time; try again shortly",
        headers=[("retry-after", str(retry_after))],
    )


def draining(retry_after: int = 2) -> ProblemError:
    """503 for new work on a replica that is stopping (SIGTERM): a balancer sends it to another
    one (nginx `proxy_next_upstream http_503`), a client retries after `Retry-After`. The
    connection closes, so that a kept-alive one does not bring the next request back here."""
    return ProblemError(
        "service_unavailable",
        "this replica is stopping and takes no new work; send it to another one, or try again shortly",
        headers=[("retry-after", str(retry_after)), ("connection", "close")],
    )
