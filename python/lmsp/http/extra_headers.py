"""Headers added to every answer a route sends (the CORS headers of an allowed origin, a token's
`x-ratelimit-*`)."""

from __future__ import annotations

from typing import Any

__all__ = ["WithHeaders"]


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
