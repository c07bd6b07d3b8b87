"""Waiting, from the event loop, for an EventLog written by a backend thread (or any
EventSource: a Redis stream's follower calls the waker on the loop itself).

The log calls a waker (on the writer's thread) at the next append or close after a reader
registered; the waker hops to the loop once. A reader that falls behind reads everything
that piled up in one go, so there is one hop per catch-up, not one per event.
"""

from __future__ import annotations

import asyncio
import functools
from typing import TYPE_CHECKING

from .. import wakeups

if TYPE_CHECKING:
    from .base import EventSource

__all__ = ["wait_closed", "wait_for_events"]


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)


async def wait_for_events(log: EventSource, after: int, timeout: float | None = None) -> bool:
    """Returns True once events after `after` exist or the log is closed; False on timeout."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[bool] = loop.create_future()
    door = wakeups.channel(loop)
    if not log.wait(after, lambda: door.post(functools.partial(_resolve, fut, True))):
        return True
    timer = loop.call_later(timeout, _resolve, fut, False) if timeout is not None else None
    try:
        return await fut
    finally:
        if timer is not None:
            timer.cancel()


async def wait_closed(log: EventSource) -> None:
    """Returns once the log has its final event."""
    while not log.closed:
        await wait_for_events(log, log.last_id)
