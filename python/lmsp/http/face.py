"""What a face gives the app to mount, and what the app gives every face.

A face (faces/lmsp, faces/openai, …) declares its routes once, each with the scope it needs
(§10): the app refuses a route without one, so none goes unguarded by omission. Errors on the
paths a face owns are written in its shape (problem documents, OpenAI error objects, …).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic_core import core_schema as cs

from ..protocol.errors import ProblemError
from ..security.limits import Limits, StreamSlots
from ..security.quota import Limiter
from ..service.models import ModelManager
from ..service.readiness import Readiness
from ..service.responses import ResponsesService
from ..service.tasks import TasksService
from .replays import Replays
from .request import Request
from .wire import Sent

__all__ = ["Face", "Handler", "OpenAPIPart", "Route", "Services"]

Handler = Callable[[Request], Awaitable[None]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str  # `{name}` matches one path segment (`{model_id}` may hold slashes)
    handler: Handler
    scope: str  # security/scopes.py
    # Asks for model work (generating, counting a prompt, embeddings): held to the token's
    # quota and counted in its usage (security/quota.py).
    metered: bool = False


@dataclass(frozen=True)
class OpenAPIPart:
    """A face's operations in the service's OpenAPI document, and the components they refer to."""

    paths: Mapping[str, Any]
    schemas: tuple[tuple[str, cs.CoreSchema], ...] = ()


@dataclass
class Services:
    """What every face is mounted with: the services it translates onto, and the HTTP limits."""

    responses: ResponsesService
    models: ModelManager
    tasks: TasksService | None
    replays: Replays | None  # Idempotency-Key records; None: keys are ignored
    limits: Limits
    streams: StreamSlots
    max_body: int
    keepalive: float
    # Every token's quota buckets and usage counts (the app admits metered routes by it).
    limiter: Limiter = field(default_factory=Limiter)
    # The whole OpenAPI document (every face's part), set once the faces are mounted.
    openapi: bytes = field(default=b"")
    # What `GET /ready` answers (http/probes.py); draining is set by a SIGTERM (server.py).
    readiness: Readiness = field(default_factory=Readiness)


class Face(Protocol):
    def routes(self) -> list[Route]: ...

    def owns(self, path: str) -> bool:
        """Whether errors on `path` (served or not) are this face's to write."""
        ...

    def send_error(self, proto: Any, error: ProblemError) -> Sent: ...

    def openapi(self) -> OpenAPIPart: ...
