"""Tasks (§7): a response generated whether or not anyone listens, whose events can be read,
and read again after a dropped connection, until they expire.

Knows nothing of HTTP. A task is a ResponseRun with a bounded, expiring EventLog and a durable
record. The record is written when the task is created (so that a process dying under it
leaves a trace that start-up turns into `failed`) and again, final, before its final event is
appended (so that no reader sees an end a crash would then forget). Once the events expire,
the in-memory entry goes and the record alone answers.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from lmsp._core import EventLog

from ..protocol.errors import ProblemError, problem
from ..protocol.ids import new_id
from ..store import Store, StoredTask, StoreWorker
from .logwait import wait_for_events
from .builder import EventTap
from .responses import LOCAL_OWNER, ResponseRun, ResponsesService

__all__ = ["DEFAULT_RETENTION", "DEFAULT_TASK_BYTES", "DEFAULT_TASK_EVENTS", "Task", "TasksService", "fail_interrupted_tasks"]

# Events kept per task, and for how long after it ends (§7 retention). A ring bound keeps a
# runaway task's memory flat; the time bound frees memory of tasks nobody came back for.
DEFAULT_TASK_EVENTS = 65536
DEFAULT_TASK_BYTES = 16 * 1024 * 1024
DEFAULT_RETENTION = 300.0


@dataclass
class Task:
    """A task this process runs or ran, while its events are kept."""

    id: str
    owner: str
    created_at: int
    run: ResponseRun
    final: dict[str, Any] | None = None  # its final response, once the log is closed

    def describe(self) -> dict[str, Any]:
        response = self.final
        if response is None and self.run.log.closed:  # closed, not yet noted by _follow
            response = self.run.snapshot()
        return _task_object(self.id, self.created_at, self.run.id, response)


def _task_object(task_id: str, created_at: int, response_id: str, response: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": task_id,
        "object": "task",
        "status": "in_progress" if response is None else response["status"],
        "created_at": created_at,
        "response_id": response_id,
        "response": response,
    }


class TasksService:
    def __init__(
        self,
        responses: ResponsesService,
        store: StoreWorker,
        *,
        max_events: int = DEFAULT_TASK_EVENTS,
        max_bytes: int = DEFAULT_TASK_BYTES,
        retention: float = DEFAULT_RETENTION,
    ) -> None:
        self.responses = responses
        self.store = store
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.retention = retention
        self._tasks: dict[str, Task] = {}  # running, or ended with events still kept
        self._by_response: dict[str, str] = {}  # response id → task id, for those
        self._following: set[asyncio.Task[None]] = set()

    async def create(self, request: dict[str, Any], owner: str = LOCAL_OWNER, tap: EventTap | None = None) -> dict[str, Any]:
        """`tap`: a second view of its events (see ResponsesService.create)."""
        if "stream" in request:
            raise ProblemError("invalid_request", "a task is read through its events endpoint, not streamed", param="stream")
        task_id = new_id("task")
        created_at = int(time.time())
        model = request["model"]

        async def before_final(response: dict[str, Any]) -> None:
            await self.store.put_task(owner, _stored(task_id, created_at, model, response, run.log.last_id + 1))

        log = EventLog(max_events=self.max_events, max_bytes=self.max_bytes, expire_after=self.retention)
        run = await self.responses.create(request, owner, log=log, before_final=before_final, tap=tap)
        task = Task(task_id, owner, created_at, run)
        self._tasks[task_id] = task
        self._by_response[run.id] = task_id
        # Queued on the store's one thread before any final record can be: order holds.
        running = StoredTask(task=_task_object(task_id, created_at, run.id, None), model=model, last_event_id=0)
        await self.store.put_task(owner, running)
        follower = asyncio.ensure_future(self._follow(task))
        self._following.add(follower)
        follower.add_done_callback(self._following.discard)
        return task.describe()

    async def get(self, task_id: str, owner: str = LOCAL_OWNER) -> dict[str, Any]:
        task = self._live(task_id, owner)
        if task is not None:
            return task.describe()
        return (await self._stored(task_id, owner)).task

    async def cancel(self, task_id: str, owner: str = LOCAL_OWNER) -> dict[str, Any]:
        """Ends a running task `cancelled`; a final one is returned unchanged."""
        task = self._live(task_id, owner)
        if task is None:
            return (await self._stored(task_id, owner)).task
        task.run.cancel()
        while not task.run.log.closed:
            await wait_for_events(task.run.log, task.run.log.last_id)
        return task.describe()

    async def events(self, task_id: str, after: int, owner: str = LOCAL_OWNER, param: str = "after") -> EventLog | None:
        """The log to stream from after `after` (given as `param`); None when nothing is left
        to send (204). Raises 410 when some of those events are gone, 404 for an unknown task."""
        task = self._live(task_id, owner)
        if task is None:
            stored = await self._stored(task_id, owner)
            if stored.last_event_id and after >= stored.last_event_id:
                return None
            raise _expired(after, stored.last_event_id + 1)
        log = task.run.log
        if after > log.last_id and not log.closed:
            raise ProblemError("invalid_request", f"event {after} has not been sent yet (the newest is {log.last_id})", param=param)
        if log.closed and after >= log.last_id:
            return None
        if after < log.first_id - 1:
            raise _expired(after, log.first_id)
        return log

    def by_response(self, response_id: str, owner: str = LOCAL_OWNER) -> Task | None:
        """The task generating a response, while its events are kept."""
        task_id = self._by_response.get(response_id)
        return self._live(task_id, owner) if task_id is not None else None

    def _live(self, task_id: str, owner: str) -> Task | None:
        task = self._tasks.get(task_id)
        return task if task is not None and task.owner == owner else None  # others' tasks: 404

    async def _stored(self, task_id: str, owner: str) -> StoredTask:
        stored = await self.store.get_task(owner, task_id)
        if stored is None:
            raise ProblemError("task_not_found", f"no task {task_id!r}", param="task_id")
        return stored

    async def _follow(self, task: Task) -> None:
        """Notes the final response when the task ends, then drops its events (and the
        in-memory entry: the store keeps the record) once the retention time is up."""
        log = task.run.log
        while not log.closed:
            await wait_for_events(log, log.last_id)
        task.final = task.run.snapshot()
        expires_at = log.expires_at
        assert expires_at is not None  # set by close
        loop = asyncio.get_running_loop()
        # EventLog times are time.monotonic(), the clock of asyncio's default loop.
        loop.call_at(expires_at, self._expire, task)

    def _expire(self, task: Task) -> None:
        task.run.log.expire()
        self._tasks.pop(task.id, None)
        self._by_response.pop(task.run.id, None)


def _expired(after: int, first_id: int) -> ProblemError:
    return ProblemError(
        "event_history_expired",
        f"events after {after} are no longer kept (the oldest kept is {first_id}); GET the task for its result",
    )


def _stored(task_id: str, created_at: int, model: str, response: dict[str, Any], last_event_id: int) -> StoredTask:
    return StoredTask(task=_task_object(task_id, created_at, response["id"], response), model=model, last_event_id=last_event_id)


def fail_interrupted_tasks(store: Store) -> int:
    """At start-up, before serving: a task the last process left running will never finish
    (its generation died with that process), so it is `failed`, never in_progress forever."""
    interrupted = store.running_tasks()
    for owner, stored in interrupted:
        task = stored.task
        response = {
            "id": task["response_id"],
            "object": "response",
            "created_at": task["created_at"],
            "status": "failed",
            "model": stored.model,
            "output": [],
            "usage": None,
            "error": problem("generation_failed", "the service stopped before the task finished"),
            "incomplete_details": None,
        }
        store.put_task(owner, _stored(task["id"], task["created_at"], stored.model, response, stored.last_event_id))
    return len(interrupted)
