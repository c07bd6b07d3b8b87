"""The stream view: writes an EventLog to an SSE response as it fills.

Frames were built once, in Rust, when appended; here they are only copied out in batches.
One loop serves both views: the stream of `POST /responses` (its run belongs to the
connection and is cancelled when the client goes, R6.3-6, R6.4-4) and a task's events
(the task runs on whoever reads or leaves, §7), which differ only in `on_lost`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from granian.rsgi import ProtocolClosed

from lmsp._core import EventHistoryExpired, encode_comment, encode_frame

from ..events.base import EventSource
from ..events.wait import wait_for_events
from ..protocol import events as ev
from ..protocol.errors import ProblemError, problem
from ..service.responses import ResponseRun, ResponsesService
from .outflow import CURRENT, Outflow, ReaderStalled
from .wire import sse_headers

__all__ = [
    "KEEPALIVE_SECONDS",
    "PacedStream",
    "answer_of",
    "relay_run",
    "replays",
    "stream_log",
    "stream_run",
    "watch_disconnect",
]

logger = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 15.0
_KEEPALIVE = encode_comment("keep-alive")


def _nothing() -> None:
    pass


def _fell_behind(cursor: int, log: Any, exc: EventHistoryExpired) -> bytes:
    """An `error` event: this reader, not the response, failed; the stream cannot go on. It
    has no id of its own: it is not one of the response's events (R6.3-2, R6.3-3). A replica's
    copy of a shared log says why itself when its response was deleted or the log lost."""
    if getattr(log, "deleted", False) or getattr(log, "lost", False):
        detail = str(exc)
    else:
        dropped = f"events {cursor + 1} to {log.first_id - 1}"
        detail = f"the client read too slowly: {dropped} were dropped before it got them"
    error = problem("event_history_expired", detail)
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
    # Every reader is measured (http/outflow.py). A reader whose run ends with it (a POST
    # stream: `on_lost` is given) is not waited for once its ring is about to drop events it
    # has not sent: a generation faster than any reader (the scripted model's ~1M events/s,
    # the events/s bench) would run the whole ring past it, and the stream would end
    # event_history_expired where unbounded it completed. Its write deadline still runs, so a
    # reader that stalls is cut and its run cancelled. A task's reader can resume instead.
    outflow = _outflow()
    owns_run = on_lost is not _nothing
    transport = proto.response_stream(200, sse_headers())
    send = _sender(transport, outflow)
    watcher = _watch(proto, on_lost)
    cursor = after
    try:
        while True:
            # Before reading: a stalled reader waits holding no frames.
            hurry = _about_to_drop(log, cursor) if owns_run else None
            if outflow is not None:
                if log.closed:  # nothing left to race: a replay needs little in flight
                    outflow.narrow(_COMPLETE_WINDOW)
                await outflow.room(hurry)
            # A measured reader reads a slice at a time, so that what waits for it is the
            # bound and one slice, never a copy of the rest of the ring (a replay of a long
            # completed task streams from the ring in slices). A writer about to lose events
            # sends all it reads at once: slice by slice, a fast generation outran even a
            # reader that kept up.
            limit = None if outflow is None or (hurry is not None and hurry()) else _SLICE
            try:
                last, frames = log.frames_after(cursor, limit)
            except EventHistoryExpired as exc:
                await send(_fell_behind(cursor, log, exc))
                on_fell_behind()
                return False
            if frames:
                await send(frames)
                frames = b""  # not held while the loop waits for room
                if last < log.last_id:  # a catch-up: the other streams write between slices
                    await asyncio.sleep(0)
                cursor = last
            elif log.closed:
                if outflow is not None:
                    await outflow.drained()  # the stream slot is held while its bytes are in flight
                return not watcher.done()
            elif not await wait_for_events(log, cursor, keepalive):
                await send(keepalive_frame)
    except ProtocolClosed:
        on_lost()
        return False
    except ReaderStalled as exc:
        # The reader stayed too far behind: its connection is closed, and what granian held
        # for it goes with it. A task's reader can resume; a POST stream's run is cancelled.
        assert outflow is not None
        _cut(outflow, exc)
        on_lost()
        return False
    finally:
        watcher.cancel()


_SLICE = 64 * 1024  # the most read from a log and written at once when the reader's drain is measured
# What a reader of a complete log (a finished task's replay) may have waiting for it, at most
# --max-stream-buffer: such a writer races no generation, so it only needs enough in flight to
# keep the connection busy, and 300 readers that never read hold ~60 MiB, not 300 × the bound.
_COMPLETE_WINDOW = 128 * 1024
# A POST stream's writer stops waiting for its reader once this many events wait to be sent:
# a quarter of the default ring (--task-events-max). A generation faster than the reader
# (the scripted model's ~1M events/s) would otherwise drop what it has not sent.
_HURRY = 16384
# A stream that starts more than _CATCH_UP events back (a resume from far back) is a replay:
# it writes up to a whole ring at its reader's pace, and each token may run only a few.
_CATCH_UP = 256


def replays(log: EventSource, after: int) -> bool:
    """Whether a stream from `after` starts far back in its log: it writes up to a whole ring
    at its reader's pace, so each token may run only a few at once."""
    return log.last_id - after > _CATCH_UP


def _about_to_drop(log: EventSource, cursor: int) -> Callable[[], bool]:
    """Whether the events not yet sent are many (_HURRY), or fill three quarters of a full
    ring: soon the ring would drop them before this reader got them."""

    def check() -> bool:
        first, last = log.first_id, log.last_id
        return last - cursor > _HURRY or (first > 1 and (cursor + 1 - first) * 4 < last - first)

    return check


def _outflow() -> Outflow | None:
    """The request's outflow, begun; None where the reader's drain cannot be measured (or
    `--max-stream-buffer 0` turned it off). Call before the response starts."""
    outflow = CURRENT.get()
    if outflow is None:
        return None
    outflow.begin()
    return outflow if outflow.measured else None


def _cut(outflow: Outflow, exc: ReaderStalled) -> None:
    """Closes the connection of a reader that stayed too far behind: what granian held for it
    goes with it."""
    if outflow.close():
        logger.info("closed a stream's connection: %s", exc)
    else:
        logger.warning("could not close a stream's connection (its socket was not found): %s", exc)


class PacedStream:
    """A response stream whose writes wait for its reader (http/outflow.py), for the faces
    that write their own frames: `room` before reading more to send, `drained` once the last
    went out; both raise ReaderStalled past the write deadline (then call `cut`)."""

    def __init__(self, proto: Any, headers: list[tuple[str, str]]) -> None:
        self.outflow = _outflow()
        self.send = _sender(proto.response_stream(200, headers), self.outflow)

    async def room(self, log: EventSource, cursor: int) -> None:
        """Waits while the reader is over the bound, unless the log's ring is about to drop
        events after `cursor` that it has not sent (see `stream_log`)."""
        if self.outflow is not None:
            await self.outflow.room(_about_to_drop(log, cursor))

    async def drained(self) -> None:
        if self.outflow is not None:
            await self.outflow.drained()

    def cut(self, exc: ReaderStalled) -> None:
        if self.outflow is not None:
            _cut(self.outflow, exc)


def _sender(transport: Any, outflow: Outflow | None) -> Callable[[bytes], Awaitable[None]]:
    if outflow is None:
        send: Callable[[bytes], Awaitable[None]] = transport.send_bytes
        return send

    async def measured(data: bytes) -> None:
        # The wait for room is the loop's, before it reads the log again: this one never waits.
        await transport.send_bytes(data)
        outflow.sent(len(data))

    return measured


async def stream_run(proto: Any, run: ResponseRun, keepalive: float = KEEPALIVE_SECONDS) -> bool:
    """The stream of `POST /responses`: the run is the connection's and ends with it."""
    # A reader that fell behind leaves nobody to read the rest; a stored one is still wanted.
    fell_behind = _nothing if run.keep else run.cancel
    return await stream_log(proto, run.log, keepalive=keepalive, on_lost=run.cancel, on_fell_behind=fell_behind)


async def relay_run(
    proto: Any,
    run: ResponseRun,
    frames: Callable[[str, Any], bytes],
    keepalive: float,
    idle_frame: bytes,
    keep: bool = False,
) -> bytes | None:
    """The stream of a face that speaks its own events (Chat Completions chunks, Anthropic's
    Messages events): the run's events turned into the face's frames as they come, with
    `idle_frame` after `keepalive` seconds of silence. The run is the connection's and ends
    with it. Returns what was sent once the final event went out, None when the stream was
    cut short; with `keep` (an Idempotency-Key asked for a replay) all of it, else b"": the
    frames are kept only for a retry to get again, and without a key there is none."""
    stream = PacedStream(proto, sse_headers())
    watcher = watch_disconnect(proto, run)
    cursor = 0
    log = run.log
    sent: list[bytes] = []
    try:
        while True:
            await stream.room(log, cursor)  # a reader past --max-stream-buffer: wait before reading more
            try:
                entries = log.entries_after(cursor)
            except EventHistoryExpired:  # this reader fell behind the ring: nobody is left to read
                run.cancel()
                return None
            if entries:
                out = b"".join(frames(name, data) for _, name, data in entries)
                cursor = entries[-1][0]
                if out:
                    await stream.send(out)
                    if keep:
                        sent.append(out)
                if entries[-1][1] in ev.FINAL_EVENTS:
                    await stream.drained()  # the stream slot is held while its bytes are in flight
                    return b"".join(sent)
            elif log.closed:
                return None
            elif not await wait_for_events(log, cursor, keepalive):
                await stream.send(idle_frame)
    except ProtocolClosed:
        run.cancel()
        return None
    except ReaderStalled as exc:  # closed, and its generation cancelled as on a disconnect
        stream.cut(exc)
        run.cancel()
        return None
    finally:
        watcher.cancel()


async def answer_of(proto: Any, run: ResponseRun, responses: ResponsesService) -> dict[str, Any]:
    """The run's whole response for a face's sync answer, the run cancelled if its client goes
    first; a failed generation is raised as its own problem, for the face to answer as an error."""
    watcher = watch_disconnect(proto, run)
    try:
        response = await responses.final_response(run)
    finally:
        watcher.cancel()
    if response["status"] == "failed":
        error = response["error"]
        raise ProblemError(error["code"], error["detail"])
    return response
