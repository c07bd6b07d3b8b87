"""Work whose only reader is its client, stopped when the client hangs up: a sync answer
nobody waits for is work for nobody (issue 38: 256 embedding inputs went on decoding after
their client left, and a client doing that in a loop starved generation)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["ClientLeft", "unless_client_leaves"]

T = TypeVar("T")


class ClientLeft(Exception):
    """The client hung up before its answer was ready; the app answers nobody (and the access
    log says 499, as nginx does)."""


async def unless_client_leaves(proto: Any, work: Awaitable[T]) -> T:
    """`work`'s result; if the client disconnects first, `work` is cancelled (and waited for, so
    that what it holds is let go) and ClientLeft is raised."""
    task = asyncio.ensure_future(work)
    watcher: asyncio.Future[Any] = asyncio.ensure_future(proto.client_disconnect())
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task.done():  # answered, even if the client left at the same moment: send it
        return task.result()
    task.cancel()
    await asyncio.wait((task,))
    if not task.cancelled():
        task.exception()  # retrieved: whatever it ended with has nobody to go to
    raise ClientLeft()
