"""Which scope each route needs (§10). The app refuses to start with a route missing here, so
no route can go unguarded by omission."""

from __future__ import annotations

from typing import Any

from ..security.scopes import ADMIN, MODELS_READ, RESPONSES_READ, RESPONSES_WRITE

__all__ = ["ROUTE_SCOPES", "WithHeaders"]

ROUTE_SCOPES: dict[tuple[str, str], str] = {
    ("GET", "/lmsp/v1/models"): MODELS_READ,
    ("GET", "/lmsp/v1/models/{model_id}"): MODELS_READ,
    ("GET", "/lmsp/v1/openapi.json"): MODELS_READ,
    ("POST", "/lmsp/v1/responses"): RESPONSES_WRITE,
    ("GET", "/lmsp/v1/responses/{response_id}"): RESPONSES_READ,
    ("POST", "/lmsp/v1/tasks"): RESPONSES_WRITE,
    ("GET", "/lmsp/v1/tasks/{task_id}"): RESPONSES_READ,
    ("GET", "/lmsp/v1/tasks/{task_id}/events"): RESPONSES_READ,
    ("POST", "/lmsp/v1/tasks/{task_id}/cancel"): RESPONSES_WRITE,
    # The OpenAI-compatible face: the same scopes for the same actions.
    ("GET", "/v1/models"): MODELS_READ,
    ("GET", "/v1/models/{model_id}"): MODELS_READ,
    ("POST", "/v1/responses"): RESPONSES_WRITE,
    ("GET", "/v1/responses/{response_id}"): RESPONSES_READ,
    ("DELETE", "/v1/responses/{response_id}"): RESPONSES_WRITE,
    ("POST", "/v1/responses/{response_id}/cancel"): RESPONSES_WRITE,
    ("GET", "/v1/responses/{response_id}/input_items"): RESPONSES_READ,
    ("POST", "/v1/chat/completions"): RESPONSES_WRITE,
    ("GET", "/metrics"): ADMIN,
}


class WithHeaders:
    """granian's protocol object, adding `extra` headers to whatever answer a route sends (the
    CORS headers of an allowed origin)."""

    __slots__ = ("_extra", "_proto")

    def __init__(self, proto: Any, extra: list[tuple[str, str]]) -> None:
        self._proto = proto
        self._extra = extra

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proto, name)

    def __aiter__(self) -> Any:
        return self._proto.__aiter__()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._proto.response_bytes(status, [*headers, *self._extra], body)

    def response_str(self, status: int, headers: list[tuple[str, str]], body: str) -> None:
        self._proto.response_str(status, [*headers, *self._extra], body)

    def response_empty(self, status: int, headers: list[tuple[str, str]]) -> None:
        self._proto.response_empty(status, [*headers, *self._extra])

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> Any:
        return self._proto.response_stream(status, [*headers, *self._extra])
