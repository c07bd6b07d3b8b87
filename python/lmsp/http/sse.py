"""The stream view: writes a response's EventLog to an SSE response as it fills.

Frames were built once, in Rust, when appended; here they are only copied out in batches.
"""

from __future__ import annotations

import asyncio
from typing import Any

from granian.rsgi import ProtocolClosed

from lmsp._core import encode_comment

from ..service.logwait import wait_for_events
from ..service.responses import ResponseRun
from .wire import sse_headers

__all__ = ["KEEPALIVE_SECONDS", "stream_run", "watch_disconnect"]

KEEPALIVE_SECONDS = 15.0
_KEEPALIVE = encode_comment("keep-alive")


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
            last, frames = log.frames_after(cursor)
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
