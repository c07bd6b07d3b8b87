"""The stream view: writes an EventLog to an SSE response as it fills.

Frames were built once, in Rust, when appended; here they are only copied out in batches.
One loop serves both views: the stream of `POST /responses` (its run belongs to the
connection and is cancelled when the client goes, R6.3-6, R6.4-4) and a task's events
(the task runs on whoever reads or leaves, §7), which differ only in `on_lost`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import orjson
from granian.rsgi import ProtocolClosed

from lmsp._core import EventHistoryExpired, encode_comment, encode_frame

from ..events.base import EventSource
from ..events.wait import wait_for_events
from ..protocol import events as ev
from ..protocol.errors import problem
from ..service.responses import ResponseRun
from .wire import sse_headers

__all__ = ["KEEPALIVE_SECONDS", "stream_log", "stream_run", "watch_disconnect"]

KEEPALIVE_SECONDS = 15.0
_KEEPALIVE = encode_comment("keep-alive")


def _nothing() -> None:
    pass


def _fell_behind(cursor: int, first_kept: int) -> bytes:
    """An `error` event: this reader, not the response, failed; the stream cannot go on. It
    has no id of its own: it is not one of the response's events (R6.3-2, R6.3-3)."""
    error = problem(
        "event_history_expired",
        f"the client read too slowly: events {cursor + 1} to {first_kept - 1} were dropped before it got them",
    )
    return encode_frame(None, ev.ERROR, orjson.dumps({"error": error}))


def watch_disconnect(proto: Any, run: ResponseRun) -> asyncio.Future[Any]:
    """Cancels the run when the client goes away (R6.3-6); cancel the watcher when done."""
    return _watch(proto, run.cancel)


def _watch(proto: Any, on_lost: Callable[[], None]) -> asyncio.Future[Any]:
    watcher: asyncio.Future[Any] = asyncio.ensure_future(proto.client_disconnect())
    watcher.add_done_callback(lambda f: None if f.cancelled() else on_lost())
    return watcher


async def stream_log(
    proto: Any,
    log: EventSource,
    *,
    after: int = 0,
    keepalive: float = KEEPALIVE_SECONDS,
    on_lost: Callable[[], None] = _nothing,
    on_fell_behind: Callable[[], None] = _nothing,
    keepalive_frame: bytes = _KEEPALIVE,
) -> bool:
    """Sends the log's events after `after` as they come; True once the final one went out,
    False if the client went away first (`on_lost` is then called) or read too slowly to
    keep up with the ring (`on_fell_behind`). Keep-alive comments fill every `keepalive`
    seconds of silence, e.g. while a long prompt is read (R6.3-5)."""
    transport = proto.response_stream(200, sse_headers())
    watcher = _watch(proto, on_lost)
    cursor = after
    try:
        while True:
            try:
                last, frames = log.frames_after(cursor)
            except EventHistoryExpired:
                await transport.send_bytes(_fell_behind(cursor, log.first_id))
                on_fell_behind()
                return False
            if frames:
                await transport.send_bytes(frames)
                cursor = last
            elif log.closed:
                return not watcher.done()
            elif not await wait_for_events(log, cursor, keepalive):
                await transport.send_bytes(keepalive_frame)
    except ProtocolClosed:
        on_lost()
        return False
    finally:
        watcher.cancel()


async def stream_run(proto: Any, run: ResponseRun, keepalive: float = KEEPALIVE_SECONDS) -> bool:
    """The stream of `POST /responses`: the run is the connection's and ends with it."""
    # A reader that fell behind leaves nobody to read the rest; a stored one is still wanted.
    fell_behind = _nothing if run.keep else run.cancel
    return await stream_log(proto, run.log, keepalive=keepalive, on_lost=run.cancel, on_fell_behind=fell_behind)
