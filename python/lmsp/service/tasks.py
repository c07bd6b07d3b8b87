"""Tasks (§7): a response generated whether or not anyone listens, whose events can be read,
and read again after a dropped connection, until they expire.

Knows nothing of HTTP. A task is a ResponseRun with a bounded, expiring EventLog and a durable
record. The record is written when the task is created (so that a process dying under it
leaves a trace that start-up turns into `failed`) and again, final, before its final event is
appended (so that no reader sees an end a crash would then forget); a task the service
stopping ends with an `error` event gets that end recorded just after, before the store closes.
Once the events expire, the in-memory entry goes and the record alone answers.

Where readers read the events is the TaskEvents backend's (events/base.py): this process's
ring by default, or a Redis stream every replica reads; the service asks it the same way for
either. With several replicas a task is also known, read and cancelled through a replica that
does not run it (its record is in the shared store). A task whose process died is ended
`failed`: at start-up, what an earlier process left (with one process, every running task),
and, with replicas, once its lease expires, by whichever replica notices first.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import orjson

from lmsp._core import EventHistoryExpired, EventLog, encode_frame

from ..events import (
    DEFAULT_RETENTION,
    DEFAULT_TASK_BYTES,
    DEFAULT_TASK_EVENTS,
    EventSource,
    InProcessEvents,
    TaskEvents,
)
from ..events.wait import wait_closed, wait_for_events
from ..protocol import events as ev
from ..protocol.errors import ProblemError, problem, unavailable
from ..protocol.ids import new_id
from ..protocol.owners import LOCAL_OWNER
from ..store import StoredTask, StoreWorker
from ..store.worker import REQUEST_DEADLINE
from .builder import EventTap
from .plan import GenerationPlan
from .responses import ResponseRun, ResponsesService

__all__ = [
    "DEFAULT_RETENTION",
    "DEFAULT_TASK_BYTES",
    "DEFAULT_TASK_EVENTS",
    "Task",
    "TasksService",
]

# Why a task ended `failed` when the process running it died: found at start-up, or later by
# the lease sweep (then another replica's).
_STOPPED_BEFORE = "the service stopped before the task finished"
_REPLICA_STOPPED = "the replica running the task stopped before it finished"
# How long a resume point beyond a shared copy's newest event waits for the copy to catch up,
# and how long a cancel through another replica waits for the task's final event.
_CATCH_UP_S = 1.0
_CANCEL_WAIT_S = 30.0

log = logging.getLogger(__name__)


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
        events: TaskEvents | None = None,
    ) -> None:
        self.responses = responses
        self.store = store
        self.event_log: TaskEvents = events if events is not None else InProcessEvents()
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.retention = retention
        self._tasks: dict[str, Task] = {}  # running, or ended with events still kept
        self._by_response: dict[str, str] = {}  # response id → task id, for those
        self._following: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """On the serving loop, before the first request."""
        await self.event_log.start()
        # Before serving: a task an earlier process left running never finishes (its generation
        # died with it), so it is `failed`, never in_progress for ever.
        await self.sweep_abandoned(_STOPPED_BEFORE)
        self._sweeper = asyncio.ensure_future(self._sweep_forever())
        if self.responses.conversations is not None:
            self.responses.conversations.start()  # stored responses' retention sweep

    async def aclose(self) -> None:
        if self.responses.conversations is not None:
            self.responses.conversations.stop()
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self.event_log.aclose()

    async def create(self, plan: GenerationPlan, tap: EventTap | None = None) -> dict[str, Any]:
        """`tap`: a second view of its events (see ResponsesService.create)."""
        owner, model = plan.owner, plan.model
        task_id = new_id("task")
        created_at = int(time.time())

        async def before_final(response: dict[str, Any]) -> None:
            if abandoned:  # its creation failed: the client was told 503, no record is owed
                return
            # Its final event is the next one; or the last, when the service stopping sent it.
            final_id = run.log.last_id if run.log.closed else run.log.last_id + 1
            await self.store.put_task(owner, _stored(task_id, created_at, model, response, final_id))
            if self.responses.conversations is not None:  # a final record holds a whole response: quotas
                await self.responses.conversations.bound(owner)

        log = EventLog(max_events=self.max_events, max_bytes=self.max_bytes, expire_after=self.retention)
        # All or nothing: published (its lease set) before anything runs, and a run whose
        # record cannot be written is cancelled and forgotten before the 503 goes out, so the
        # client's retry is the only run. A cancel asked for before the run exists is kept.
        started: list[ResponseRun] = []
        asked: list[bool] = []
        abandoned = False
        await self.event_log.publish(task_id, log, lambda: started[0].cancel() if started else asked.append(True))
        try:
            run = await self.responses.create(plan, log=log, before_final=before_final, tap=tap)
        except BaseException:
            await self.event_log.unpublish(task_id)
            raise
        started.append(run)
        if asked:
            run.cancel()
        task = Task(task_id, owner, created_at, run)
        self._tasks[task_id] = task
        self._by_response[run.id] = task_id
        # Queued on the store's one thread before any final record can be: order holds (a
        # shared store, whose calls may overtake each other, never replaces a final record).
        running = StoredTask(task=_task_object(task_id, created_at, run.id, None), model=model, last_event_id=0)
        try:
            await self.store.put_task(owner, running, deadline=REQUEST_DEADLINE)
        except BaseException:
            # Not awaited: its end would wait for the store this failed on.
            abandoned = True
            run.cancel()
            self._tasks.pop(task_id, None)
            self._by_response.pop(run.id, None)
            await self.event_log.unpublish(task_id)
            raise
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
            stored = await self._stored(task_id, owner)
            if stored.task["status"] == "in_progress":  # run by another process
                return await self._cancel_elsewhere(stored, owner)
            return stored.task
        await task.run.cancel_and_wait()
        return task.describe()

    async def events(
        self, task_id: str, after: int, owner: str = LOCAL_OWNER, param: str = "after"
    ) -> EventSource | None:
        """The events to stream from after `after` (given as `param`); None when nothing is
        left to send (204). Raises 410 when some of those events are gone, 404 for an unknown task."""
        task = self._live(task_id, owner)
        stored = await self._stored(task_id, owner) if task is None else None
        final = (
            stored.task["status"] != "in_progress" if stored is not None else task is not None and task.run.log.closed
        )
        source = await self.event_log.source(task_id, final)
        if source is None:  # its events expired: the record says how it ended
            last_id = stored.last_event_id if stored is not None else task.run.log.last_id if task is not None else 0
            if last_id and after >= last_id:
                return None
            raise _expired(after, last_id + 1)
        try:
            source.frames_after(max(after, source.first_id - 1, source.last_id))  # a copy that lost its history
        except EventHistoryExpired:
            raise _expired(after, source.first_id) from None
        if after > source.last_id and not source.closed and after > await self.event_log.newest(task_id, source):
            if math.isfinite(self.event_log.lease):  # a shared copy, catching up after an outage?
                await wait_for_events(source, after - 1, _CATCH_UP_S)
            if after > source.last_id and not source.closed:
                if source.first_id > 1:  # the copy lost events (data loss in Redis): ask the task
                    raise _expired(after, source.first_id)
                raise ProblemError(
                    "invalid_request",
                    f"event {after} has not been sent yet (the newest is {source.last_id})",
                    param=param,
                )
        if source.closed and after >= source.last_id:
            return None
        if after < source.first_id - 1:
            raise _expired(after, source.first_id)
        return source

    def by_response(self, response_id: str, owner: str = LOCAL_OWNER) -> Task | None:
        """The task generating a response, while its events are kept."""
        task_id = self._by_response.get(response_id)
        return self._live(task_id, owner) if task_id is not None else None

    def forget_response(self, response_id: str, owner: str = LOCAL_OWNER) -> None:
        """A deleted response's live copies go with it: its task's ring and every face's view of
        it (a GET that reads the live task first would otherwise still find the content)."""
        task = self.by_response(response_id, owner)
        if task is None:
            return
        for view in task.run.views.values():
            view_log = getattr(view, "log", None)
            if view_log is not None and hasattr(view_log, "expire"):
                view_log.expire()
        task.run.views.clear()
        self._expire(task)

    async def delete_response(self, response_id: str, owner: str = LOCAL_OWNER) -> None:
        """DELETE of a response (issue 38), one operation a client may retry until it answers:
        its tasks' events first (this process's rings, every face's view, the shared log),
        then every stored copy at once (ResponsesService.delete)."""

        async def drop_events(task_ids: list[str]) -> None:
            self.forget_response(response_id, owner)
            await self.drop_events(task_ids)

        await self.responses.delete(response_id, owner, before=drop_events)

    async def drop_events(self, task_ids: list[str]) -> None:
        """A deleted response's tasks: their events go from the shared log too (the Redis
        stream a replica reads them from), not only from this process's ring."""
        for task_id in task_ids:
            await self.event_log.unpublish(task_id)

    def _live(self, task_id: str, owner: str) -> Task | None:
        task = self._tasks.get(task_id)
        if task is None or task.owner != owner:  # others' tasks: 404
            return None
        # A ring expired before the task was let go: its response was deleted through another
        # replica (the shared event log expired it here, issue 28). The store answers: 404.
        return None if task.run.log.expired else task

    async def _stored(self, task_id: str, owner: str) -> StoredTask:
        stored = await self.store.get_task(owner, task_id)
        if stored is None:
            raise ProblemError("task_not_found", f"no task {task_id!r}", param="task_id")
        return stored

    async def _cancel_elsewhere(self, stored: StoredTask, owner: str) -> dict[str, Any]:
        """Asks the replica that runs it, and waits for its final event (again each second:
        pub/sub keeps no message for a replica that was reconnecting)."""
        task_id = stored.id
        source = await self.event_log.source(task_id, False)
        if source is None:  # its events are nowhere to be read: nor is its run to be reached
            return stored.task
        give_up_at = time.monotonic() + _CANCEL_WAIT_S
        while not source.closed:
            if time.monotonic() > give_up_at:
                # Its replica got the request but its end did not reach the shared log in
                # time (Redis away): the client asks again; a cancel is idempotent.
                raise unavailable("the replica running the task")
            await self.event_log.request_cancel(task_id)
            deadline = time.monotonic() + 1.0
            while not source.closed and time.monotonic() < deadline:
                await wait_for_events(source, source.last_id, max(0.0, deadline - time.monotonic()))
        # Its record was final before its final event went out.
        return (await self._stored(task_id, owner)).task

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.event_log.lease / 2)  # for ever where the lease never lapses
            try:
                await self.store.heartbeat(time.time())  # this replica's idempotency claims are live
                await self.sweep_abandoned()
            except Exception:  # Redis or the database away for a moment: the next round retries
                log.exception("could not look for abandoned tasks")

    async def sweep_abandoned(self, why: str = _REPLICA_STOPPED) -> int:
        """Ends `failed` (`why`) every running task, of any replica, whose lease expired: its
        process died, and its readers would wait for ever. Returns how many this one ended."""
        running = [
            (owner, stored) for owner, stored in await self.store.running_tasks() if stored.id not in self._tasks
        ]
        dead = set(await self.event_log.abandoned([stored.id for _, stored in running]))
        ended = 0
        for owner, stored in running:
            if stored.id in dead and await self._end_abandoned(owner, stored, why):
                ended += 1
        return ended

    async def _end_abandoned(self, owner: str, stored: StoredTask, why: str) -> bool:
        claim = await self.event_log.take_over(stored.id)
        if claim is None:
            return False
        last_id, ended = claim
        current = await self.store.get_task(owner, stored.id)
        if current is None or current.task["status"] != "in_progress":
            return False  # it ended after all
        response = _failed_response(current, why)
        final_id = last_id if ended else last_id + 1
        task = current.task
        # The record first, as for every task: no reader sees an end that is not kept.
        await self.store.put_task(owner, _stored(task["id"], task["created_at"], current.model, response, final_id))
        if not ended:
            data = orjson.dumps({"response_id": response["id"], "status": "failed", "error": response["error"]})
            await self.event_log.append_final(task["id"], final_id, encode_frame(final_id, ev.FAILED, data))
        log.warning("task %s: %s; ended it failed", task["id"], why)
        return True

    async def _follow(self, task: Task) -> None:
        """Notes the final response when the task ends, then drops its events (and the
        in-memory entry: the store keeps the record) once the retention time is up."""
        log = task.run.log
        await wait_closed(log)
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
    return StoredTask(
        task=_task_object(task_id, created_at, response["id"], response), model=model, last_event_id=last_event_id
    )


def _failed_response(stored: StoredTask, detail: str) -> dict[str, Any]:
    """The response of a task whose generation died with its process."""
    task = stored.task
    return {
        "id": task["response_id"],
        "object": "response",
        "created_at": task["created_at"],
        "status": "failed",
        "model": stored.model,
        "output": [],
        "usage": None,
        "error": problem("generation_failed", detail),
        "incomplete_details": None,
    }
