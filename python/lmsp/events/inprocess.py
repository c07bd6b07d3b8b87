"""The default task event log: each task's events are read from its own ring, in the process
that runs it. It answers the same calls as the shared one (events/redis.py) so that the
service reads, resumes and cancels a task the same way whichever it has: `source` hands out
the ring itself (an EventLog is an EventSource), `request_cancel` cancels a task run here, and
the lease never lapses while this process lives, so only what an earlier process left running
is ever abandoned (found by the sweep at start-up).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from lmsp._core import EventLog

from .base import EventSource

__all__ = ["InProcessEvents"]

# The table of published rings is pruned of expired ones each time it doubles: amortised O(1)
# per task, and an expired ring holds no events (EventLog.expire freed them), only its ids.
_PRUNE_FLOOR = 64


@dataclass(frozen=True)
class _Published:
    ring: EventLog
    cancel: Callable[[], None]


class InProcessEvents:
    # No other process can run a task whose events live here: a task's owner is alive as long
    # as anyone can ask, so its lease never lapses (and the periodic sweep never wakes).
    lease = math.inf

    def __init__(self) -> None:
        self._published: dict[str, _Published] = {}
        self._prune_at = _PRUNE_FLOOR
        self._claimed: set[str] = set()

    async def start(self) -> None:
        pass

    async def publish(self, task_id: str, log: EventLog, cancel: Callable[[], None]) -> None:
        if len(self._published) >= self._prune_at:
            self._published = {t: p for t, p in self._published.items() if not p.ring.expired}
            self._prune_at = max(_PRUNE_FLOOR, 2 * len(self._published))
        self._published[task_id] = _Published(log, cancel)

    async def unpublish(self, task_id: str) -> None:
        self._published.pop(task_id, None)

    def _ring(self, task_id: str) -> EventLog | None:
        published = self._published.get(task_id)
        if published is None:
            return None
        if published.ring.expired:  # its retention is over: the task's record answers now
            del self._published[task_id]
            return None
        return published.ring

    async def source(self, task_id: str, final: bool) -> EventSource | None:
        # A task not published here has no events anywhere: the process that ran it is gone.
        return self._ring(task_id)

    async def newest(self, task_id: str, source: EventSource) -> int:
        return source.last_id  # the ring is the only copy: nothing is newer than it

    async def request_cancel(self, task_id: str) -> None:
        published = self._published.get(task_id)
        if published is not None and not published.ring.closed:
            published.cancel()

    async def abandoned(self, task_ids: list[str]) -> list[str]:
        # A running task not published by this process was left by one that stopped.
        return [t for t in task_ids if self._ring(t) is None]

    async def take_over(self, task_id: str) -> tuple[int, bool] | None:
        if task_id in self._claimed or self._ring(task_id) is not None:
            return None
        self._claimed.add(task_id)
        # Its events died with the process that ran it: there is no log to append an end to,
        # and its readers, who lost the connection with that process, read the record.
        return 0, True

    async def append_final(self, task_id: str, event_id: int, frame: bytes) -> None:
        raise AssertionError("take_over never leaves an in-process task an event to append")

    async def ping(self) -> None:
        pass  # this process's own memory

    async def aclose(self) -> None:
        pass
