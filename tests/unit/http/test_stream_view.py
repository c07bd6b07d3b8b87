"""The stream view on its own, with a stand-in for granian's protocol object: what a reader
that falls out of the log's ring gets. (granian buffers a slow reader's bytes itself, so a real
socket cannot be made to fall behind on demand.)"""

from __future__ import annotations

import asyncio
import tracemalloc
from typing import Any

import orjson

from helpers import check_event
from lmsp._core import EventLog, SseParser
from lmsp.http.sse import relay_run, stream_run
from lmsp.service.builder import EventBuilder
from lmsp.service.responses import ResponseRun


class _Transport:
    def __init__(self, on_first_send: Any) -> None:
        self.sent: list[bytes] = []
        self._on_first_send = on_first_send

    async def send_bytes(self, data: bytes) -> None:
        if not self.sent:
            self._on_first_send()  # the producer races ahead while this send is stuck
        self.sent.append(data)


class _Proto:
    def __init__(self, transport: _Transport) -> None:
        self.transport = transport

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> _Transport:
        assert status == 200
        return self.transport

    async def client_disconnect(self) -> None:
        await asyncio.Event().wait()  # never: this client stays


def test_reader_that_falls_behind_the_ring_gets_an_error_event():  # covers: R6.3-2, R6.3-3
    log = EventLog(max_events=4)
    builder = EventBuilder(log, "resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF")
    run = ResponseRun("resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF", "m", 0, log, builder, [], keep=False)
    builder.created()

    def burst() -> None:
        for _ in range(10):
            builder.on_text("w ")

    transport = _Transport(burst)
    delivered = asyncio.run(stream_run(_Proto(transport), run, keepalive=5))
    assert delivered is False
    parser = SseParser()
    events = [e for chunk in transport.sent for e in parser.feed(chunk)]
    assert [e.event for e in events] == ["response.created", "error"]
    data = orjson.loads(events[-1].data)
    check_event("error", data)
    assert data["error"]["code"] == "event_history_expired"
    # created (1), item added (2), ten deltas (3-12); a ring of 4 keeps 9-12
    assert "events 2 to 8 were dropped" in data["error"]["detail"]


class _Producing:
    """A transport that discards what it is sent, and has the generation go on meanwhile."""

    def __init__(self, builder: EventBuilder, tokens: int) -> None:
        self.builder, self.left, self.received = builder, tokens, 0

    async def send_bytes(self, data: bytes) -> None:
        self.received += len(data)
        for _ in range(min(100, self.left)):
            self.builder.on_text("x ")
        self.left = max(0, self.left - 100)
        if not self.left and not self.builder.log.closed:
            self.builder.on_finish("stop", 1, 50_000)


def test_a_face_stream_keeps_its_frames_only_when_asked():
    # Chat Completions and Anthropic streams kept every frame they sent, for an Idempotency-Key's
    # replay, also without a key: ~200 B a token a stream, bounded by nothing (issue 38).
    log = EventLog()
    builder = EventBuilder(log, "resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF")
    run = ResponseRun("resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF", "m", 0, log, builder, [], keep=False)
    builder.created()
    transport = _Producing(builder, 50_000)
    chunk = b"data: " + b"c" * 200 + b"\n\n"

    tracemalloc.start()
    try:
        sent = asyncio.run(relay_run(_Proto(transport), run, lambda _name, _data: chunk, 5, b": idle\n\n"))  # type: ignore[arg-type]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert transport.received > 50_000 * len(chunk)  # the whole stream went out
    assert sent == b""  # nothing kept: no key asked for it
    assert peak < 2 * 1024 * 1024, peak  # before: the ~10 MB sent, kept, then joined again


def test_a_face_stream_keeps_every_frame_for_an_idempotency_key():
    log = EventLog()
    builder = EventBuilder(log, "resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF")
    run = ResponseRun("resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF", "m", 0, log, builder, [], keep=False)
    builder.created()
    transport = _Producing(builder, 1_000)
    sent = asyncio.run(relay_run(_Proto(transport), run, lambda name, _data: name.encode() + b"\n", 5, b"", keep=True))  # type: ignore[arg-type]
    assert sent is not None and len(sent) == transport.received
    assert sent.count(b"response.output_text.delta\n") == 1_000
