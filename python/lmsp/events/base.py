"""The task event log's interface: where a task's events are kept and read.

A task's events are always appended to its ring (`lmsp._core.EventLog`) on the backend's
thread, framed once, in Rust: that is the hot path, and it is the same whatever keeps the
events for readers. The engine decides who can read them:

- in this process (`InProcessEvents`, the default): readers read the ring itself;
- in Redis Streams (`RedisEvents`, `--events redis://…`): the ring's frames are carried to a
  stream that readers on every replica follow, so a task created through one replica is read,
  resumed and cancelled through any.

A reader sees an `EventSource`: read after N (`frames_after`, EventHistoryExpired -> 410 when
some of those events are gone) and wait for more (`wait`, what `logwait.wait_for_events`
awaits). The Rust EventLog is one, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from lmsp._core import EventLog

__all__ = ["EventSource", "InProcessEvents", "TaskEvents"]


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

    def frames_after(self, after: int) -> tuple[int, bytes]:
        """(last id, the wire frames after `after`); EventHistoryExpired if some are gone."""
        ...

    def wait(self, after: int, waker: Callable[[], object]) -> bool:
        """Registers `waker` for the next event or the end; False (not registered) when there
        is already something to read after `after`, or nothing more will come."""
        ...


class TaskEvents(Protocol):
    """Keeps tasks' events beyond their ring, when several replicas must read them."""

    @property
    def shared(self) -> bool:
        """Readers elsewhere see this process's tasks (and this process sees theirs)."""
        ...

    @property
    def lease(self) -> float:
        """Seconds after which a task whose owner stopped renewing its lease is abandoned."""
        ...

    async def start(self) -> None: ...

    async def publish(self, task_id: str, log: EventLog, cancel: Callable[[], None]) -> None:
        """From now on the ring's events are readable as `task_id`'s; `cancel` is called when
        any replica asks to cancel it."""
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
        """Those of these running tasks whose owner's lease expired."""
        ...

    async def take_over(self, task_id: str) -> tuple[int, bool] | None:
        """Claims an abandoned task for this replica to end: (its last event id, whether that
        was the final one); None when another replica has claimed it."""
        ...

    async def append_final(self, task_id: str, event_id: int, frame: bytes) -> None:
        """Appends a taken-over task's final event (framed by `lmsp._core.encode_frame`)."""
        ...

    async def aclose(self) -> None: ...


class InProcessEvents:
    """The default: a task's events live in its ring, read by this process's readers only."""

    shared = False
    lease = 0.0

    async def start(self) -> None:
        pass

    async def publish(self, task_id: str, log: EventLog, cancel: Callable[[], None]) -> None:
        pass

    async def source(self, task_id: str, final: bool) -> EventSource | None:
        return None  # the service reads a live task's ring itself; an unknown one has none

    async def newest(self, task_id: str, source: EventSource) -> int:
        return source.last_id

    async def request_cancel(self, task_id: str) -> None:
        pass

    async def abandoned(self, task_ids: list[str]) -> list[str]:
        return []  # no other process owns tasks here: start-up fails what the last one left

    async def take_over(self, task_id: str) -> tuple[int, bool] | None:
        return None

    async def append_final(self, task_id: str, event_id: int, frame: bytes) -> None:
        raise AssertionError("an in-process task is never taken over")

    async def aclose(self) -> None:
        pass
