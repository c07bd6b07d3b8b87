"""An incoming request: what a route needs from granian's scope and protocol."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from ..protocol.errors import ProblemError

__all__ = ["Request"]


class Request:
    __slots__ = ("params", "proto", "scope")

    def __init__(self, scope: Any, proto: Any, params: dict[str, str]) -> None:
        self.scope = scope
        self.proto = proto
        self.params = params

    def header(self, name: str) -> str | None:
        value: str | None = self.scope.headers.get(name)
        return value

    def header_values(self, name: str) -> list[str]:
        """Every value of a header that may come more than once (`name` in lower case)."""
        return [v for k, v in self.scope.headers.items() if k == name]

    @property
    def query(self) -> dict[str, list[str]]:
        return parse_qs(self.scope.query_string)

    async def body(self, limit: int) -> bytes:
        """The whole body, refusing (413) as soon as it grows past `limit` bytes."""
        declared = self.header("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks = []
        size = 0
        async for chunk in self.proto:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
        return b"".join(chunks)


def _too_large(limit: int) -> ProblemError:
    return ProblemError("request_too_large", f"the body is larger than {limit} bytes")
