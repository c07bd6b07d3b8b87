"""The task event log's interface: where a task's events are kept and read.

A task's events are always appended to its ring (`lmsp._core.EventLog`) on the backend's
thread, framed once, in Rust: that is the hot path, and it is the same whatever keeps the
events for readers. Where readers read them is the TaskEvents backend's choice:

- in this process (`InProcessEvents`, events/inprocess.py, the default): readers read the
  ring itself;
- in Redis Streams (`RedisEvents`, events/redis.py, `--events redis://…`): the ring's frames
  are carried to a stream that readers on every replica follow, so a task created through one
  replica is read, resumed and cancelled through any.

Either way a reader asks `source` and sees an `EventSource`: read after N (`frames_after`,
EventHistoryExpired -> 410 when some of those events are gone) and wait for more (`wait`, what
`wait.wait_for_events` awaits). The service never asks which backend it has: each answers every
call, and tests/contract/test_task_events_contract.py holds each to the same behaviour.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from lmsp._core import EventLog

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_RETENTION",
    "DEFAULT_TASK_BYTES",
    "DEFAULT_TASK_EVENTS",
    "EventSource",
    "TaskEvents",
]

# Events kept per task, and for how long after it ends (§7 retention). A ring bound keeps a
# runaway task's memory flat; the time bound frees memory of tasks nobody came back for. A
# shared copy of a task's events keeps the same bounds as its ring.
DEFAULT_TASK_EVENTS = 65536
DEFAULT_TASK_BYTES = 16 * 1024 * 1024
DEFAULT_RETENTION = 300.0
# Seconds a replica's task lease lasts unrenewed (events/redis.py).
DEFAULT_LEASE = 10.0


class EventSource(Protocol):
    @property
    def first_id(self) -> int:
        """The oldest id still kept; `last_id + 1` when none is."""
        ...

    @property
    def last_id(self) -> int: ...

    @property
    def closed(self) -> bool:
        """The final event is among those read."""
        ...

    def frames_after(self, after: int, limit: int | None = None) -> tuple[int, bytes]:
        """(last id, the wire frames after `after`); EventHistoryExpired if some are gone.
        `limit`: only the whole frames within that many bytes (the first one always), and the
        id of the last of them: a reader far behind copies out a chunk at a time."""
        ...

    def wait(self, after: int, waker: Callable[[], object]) -> bool:
        """Registers `waker` for the next event or the end; False (not registered) when there
        is already something to read after `after`, or nothing more will come."""
        ...


class TaskEvents(Protocol):
    """Where tasks' events are read from: the ring of the process that runs each task, or a
    copy every replica reads."""

    @property
    def lease(self) -> float:
        """Seconds after which a task whose owner stopped renewing its lease is abandoned;
        infinite where only this process runs tasks (what it left is found once, at start)."""
        ...

    async def start(self) -> None: ...

    async def publish(self, task_id: str, log: EventLog, cancel: Callable[[], None]) -> None:
        """From now on the ring's events are readable as `task_id`'s; `cancel` is called when
        any replica asks to cancel it."""
        ...

    async def unpublish(self, task_id: str) -> None:
        """Undoes `publish` for a task whose creation failed after it (nothing of it stays)."""
        ...

    async def source(self, task_id: str, final: bool) -> EventSource | None:
        """What to read a task's events from; None when none are kept any more (`final`: its
        record says it ended, so a stream that is missing expired rather than not begun)."""
        ...

    async def newest(self, task_id: str, source: EventSource) -> int:
        """The newest id appended anywhere (`source` may lag behind it by a moment)."""
        ...

    async def request_cancel(self, task_id: str) -> None:
        """Asks the replica that runs the task to cancel it."""
        ...

    async def abandoned(self, task_ids: list[str]) -> list[str]:
        """Those of these running tasks whose owner's lease expired (tasks published by a live
        process never are)."""
        ...

    async def take_over(self, task_id: str) -> tuple[int, bool] | None:
        """Claims an abandoned task for this replica to end: (its last event id, whether no
        final event is to be appended: it has one, or its events died with its process); None
        when it was claimed already."""
        ...

    async def append_final(self, task_id: str, event_id: int, frame: bytes) -> None:
        """Appends a taken-over task's final event (framed by `lmsp._core.encode_frame`)."""
        ...

    async def ping(self) -> None:
        """Raises (as any call would) when the events cannot be reached: the readiness probe."""
        ...

    async def aclose(self) -> None: ...
