"""The stream view: writes a response's EventLog to an SSE response as it fills.

Frames were built once, in Rust, when appended; here they are only copied out in batches.
"""

from __future__ import annotations

import asyncio
from typing import Any

from granian.rsgi import ProtocolClosed

import orjson

from lmsp._core import EventHistoryExpired, encode_comment, encode_frame

from ..protocol import events as ev
from ..protocol.errors import problem
from ..service.logwait import wait_for_events
from ..service.responses import ResponseRun
from .wire import sse_headers

__all__ = ["KEEPALIVE_SECONDS", "stream_run", "watch_disconnect"]

KEEPALIVE_SECONDS = 15.0
_KEEPALIVE = encode_comment("keep-alive")


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
    watcher = asyncio.ensure_future(proto.client_disconnect())
    watcher.add_done_callback(lambda f: None if f.cancelled() else run.cancel())
    return watcher


async def stream_run(proto: Any, run: ResponseRun, keepalive: float = KEEPALIVE_SECONDS) -> bool:
    """Sends the run's events as they come; True once the final one went out, False if the
    client went away first. Keep-alive comments fill every `keepalive` seconds of silence,
    e.g. while a long prompt is read (R6.3-5)."""
    transport = proto.response_stream(200, sse_headers())
    log = run.log
    watcher = watch_disconnect(proto, run)
    cursor = 0
    try:
        while True:
            try:
                last, frames = log.frames_after(cursor)
            except EventHistoryExpired:
                await transport.send_bytes(_fell_behind(cursor, log.first_id))
                if not run.keep:  # nobody will read the rest; a stored one is still wanted
                    run.cancel()
                return False
            if frames:
                await transport.send_bytes(frames)
                cursor = last
            elif log.closed:
                return not watcher.done()
            elif not await wait_for_events(log, cursor, keepalive):
                await transport.send_bytes(_KEEPALIVE)
    except ProtocolClosed:
        run.cancel()
        return False
    finally:
        watcher.cancel()
