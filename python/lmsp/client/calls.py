"""The parts of a call that do not depend on how it is sent: URLs, headers, bodies, reading
an answer into a result or an exception, folding a stream's events into its response, and the
resume state of a task's event stream. Client (sync.py) and AsyncClient (aio.py) share these."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from lmsp._core import SseEvent
from lmsp.protocol.events import ERROR, fold

from .errors import ERRORS, APIError, error_from_answer
from .retry import Attempts, Retry, retry_after_seconds
from .types import Event, Response

__all__ = [
    "API",
    "DEFAULT_BASE_URL",
    "Call",
    "Resume",
    "error_of",
    "fold_stream",
    "headers",
    "model_segments",
    "request_body",
    "resolve_base_url",
    "segment",
]

API = "/lmsp/v1"
DEFAULT_BASE_URL = "http://127.0.0.1:8750"
LMSP_VERSION = "1.0"


def resolve_base_url(value: str | None) -> str:
    """The service's root, from the argument, else $LMSP_BASE_URL, else the local default;
    given with or without its `/lmsp/v1`."""
    url = (value or os.environ.get("LMSP_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
    return url.removesuffix(API)


def segment(value: str) -> str:
    """An id as one path segment: `/`, `?`, `#`, `%` and `..` cannot reach another resource."""
    return quote(value, safe="") if value not in (".", "..") else value.replace(".", "%2E")


def model_segments(model_id: str) -> str:
    """A model id in a path: its slashes kept (Ollama's ids hold them), everything else encoded."""
    return "/".join(segment(part) for part in model_id.split("/"))


def headers(token: str | None) -> dict[str, str]:
    token = token or os.environ.get("LMSP_TOKEN")
    found = {"lmsp-version": LMSP_VERSION}
    if token:
        found["authorization"] = f"Bearer {token}"
    return found


def request_body(model: str, input: str | list[dict[str, Any]], fields: dict[str, Any]) -> dict[str, Any]:
    """A responses request; a string `input` is one user message. Fields left None are left out,
    so that the service's defaults apply."""
    if isinstance(input, str):
        input = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": input}]}]
    return {"model": model, "input": input, **{k: v for k, v in fields.items() if v is not None}}


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    json: Any = None
    params: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def post(cls, path: str, body: Any = None, key: str | None = None) -> Call:
        """Every POST carries an Idempotency-Key, so that each retry of it is the same request
        to the service: it runs once, and a retry gets its answer."""
        return cls("POST", path, json=body, headers={"idempotency-key": key or str(uuid.uuid4())})


def error_of(answer: httpx.Response) -> APIError:
    """The exception for an error answer whose body has been read."""
    return error_from_answer(answer.status_code, answer.content, retry_after_seconds(answer.headers.get("retry-after")))


def error_of_problem(problem: dict[str, Any]) -> APIError:
    cls = ERRORS.get(problem.get("code", ""), APIError)
    return cls(
        int(problem.get("status", 500)),
        str(problem.get("detail", "")),
        param=problem.get("param"),
        title=problem.get("title"),
    )


def fold_stream(events: list[Event], model: str) -> Response:
    """The response a stream's events add up to, by the service's own fold (so that the two
    cannot disagree). A stream that ended with an `error` event (no response) raises it."""
    if events and events[-1].type == ERROR:
        raise error_of_problem(events[-1].data["error"])
    response_id = events[0].data["response_id"] if events else ""
    entries = ((e.id, e.type, orjson.dumps(e.data)) for e in events)
    folded = fold(entries, response_id=response_id, created_at=0, model=model)
    return Response.from_json({**folded, "created_at": None})


class Resume:
    """Reading a task's events over as many connections as it takes: where to start the next
    one, which events are new, and when it is over."""

    def __init__(self, task_id: str, after: int | None, policy: Retry) -> None:
        self.path = f"{API}/tasks/{segment(task_id)}/events"
        self.last = after or 0
        self.done = False
        self.attempts = Attempts(policy)

    def params(self) -> dict[str, int] | None:
        return {"after": self.last} if self.last else None

    def take(self, parsed: Iterable[SseEvent]) -> list[Event]:
        events = [Event.from_sse(e.id, e.event, e.data) for e in parsed]
        if events:
            self.last = events[-1].id
            self.done = events[-1].final
            self.attempts.progressed()
        return events

    def gave_up(self) -> str:
        return f"{self.path}: no new event in {self.attempts.failures} connections after event {self.last}"
