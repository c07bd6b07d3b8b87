"""The task endpoints (§7). HTTP only: parse, call the TasksService, write the answer."""

from __future__ import annotations

import re

from ..protocol.errors import ProblemError
from ..security.limits import Limits, StreamSlots
from ..service.idempotency import Idempotency
from ..service.tasks import TasksService
from .idempotency import answer_once, idempotency_key
from .intake import read_response_request
from .request import Request
from .sse import stream_log
from .wire import LMSP_VERSION, Sent, send_json

__all__ = ["TaskRoutes", "resume_after"]

_EVENT_ID = re.compile(r"[0-9]{1,18}")
_CREATE = "POST /lmsp/v1/tasks"


def _event_id(value: str, param: str) -> int:
    if not _EVENT_ID.fullmatch(value):
        raise ProblemError(
            "invalid_request", f"{param} must be an event id (a non-negative integer), not {value!r}", param=param
        )
    return int(value)


def resume_after(req: Request) -> tuple[int, str]:
    """The id to resume after and where it came from: `?after=N`, else `Last-Event-ID`,
    else 0 (R6.4-2: `after` wins). Both are checked whichever wins: a malformed one is a
    mistake to report, not something to ignore."""
    after = req.query_value("after")
    values = req.header_values("last-event-id")
    if len(values) > 1:
        raise ProblemError("invalid_request", "give Last-Event-ID once", param="Last-Event-ID")
    header = _event_id(values[0].strip(), "Last-Event-ID") if values else 0
    if after is not None:
        return _event_id(after, "after"), "after"
    return header, "Last-Event-ID"


class TaskRoutes:
    def __init__(
        self,
        tasks: TasksService,
        idempotency: Idempotency | None,
        max_body: int,
        keepalive: float,
        limits: Limits,
        streams: StreamSlots,
    ) -> None:
        self.tasks = tasks
        self.idempotency = idempotency
        self.max_body = max_body
        self.keepalive = keepalive
        self.limits = limits
        self.streams = streams

    def table(self) -> dict[tuple[str, str], object]:
        return {
            ("POST", "/lmsp/v1/tasks"): self.create_task,
            ("GET", "/lmsp/v1/tasks/{task_id}"): self.get_task,
            ("GET", "/lmsp/v1/tasks/{task_id}/events"): self.task_events,
            ("POST", "/lmsp/v1/tasks/{task_id}/cancel"): self.cancel_task,
        }

    async def create_task(self, req: Request) -> None:
        key = idempotency_key(req) if self.idempotency is not None else None
        body, request = await read_response_request(req, self.max_body, self.limits)
        await answer_once(req, self.idempotency, key, _CREATE, body, lambda: self._create(req, request))

    async def _create(self, req: Request, request: dict[str, object]) -> Sent:
        # A retry gets this same 202 (the same task), whatever the task has done since: the
        # task's own state is what GET reads.
        task = await self.tasks.create(request, req.owner)
        return send_json(req.proto, 202, task, [("location", f"/lmsp/v1/tasks/{task['id']}")])

    async def get_task(self, req: Request) -> None:
        send_json(req.proto, 200, await self.tasks.get(req.params["task_id"], req.owner))

    async def cancel_task(self, req: Request) -> None:
        send_json(req.proto, 200, await self.tasks.cancel(req.params["task_id"], req.owner))

    async def task_events(self, req: Request) -> None:
        after, param = resume_after(req)
        source = await self.tasks.events(req.params["task_id"], after, req.owner, param)
        if source is None:
            # Nothing after the final event: 204 tells an EventSource to stop reconnecting.
            req.proto.response_empty(204, [("lmsp-version", LMSP_VERSION)])
            return
        # The task runs on whether this reader stays or goes (§7): no on_lost.
        with self.streams.hold(req.principal):
            await stream_log(req.proto, source, after=after, keepalive=self.keepalive)  # type: ignore[arg-type]  # an EventSource
