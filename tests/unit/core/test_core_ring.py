"""The EventLog ring through the binding: bounds, ids, expiry, errors and waking.

Pure `lmsp._core` checks, no server. The Rust crate has the exhaustive (property) tests;
these pin the Python API the service relies on.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import math
import threading
import time
from pathlib import Path

import pytest

import lmsp._core as core
from lmsp._core import EventHistoryExpired, EventLog, InvalidLimit, LmspCoreError, SseParser
from lmsp.events.wait import wait_for_events

DELTA = "response.output_text.delta"
HEAD = b'{"response_id":"resp_X","item_id":"msg_Y","delta":'


def fill(log: EventLog, n: int) -> None:
    for i in range(n):
        log.append_text(DELTA, HEAD, f"t{i}", b"}")


def parsed_ids(frames: bytes) -> list[int]:
    return [int(e.id) for e in SseParser().feed(frames)]


def test_defaults_and_keyword_only_limits():
    log = EventLog()
    assert (log.max_events, log.max_bytes, log.expire_after) == (65_536, 16 << 20, 300.0)
    assert (log.first_id, log.last_id, log.closed, log.expired, log.expires_at) == (1, 0, False, False, None)
    assert str(inspect.signature(EventLog)) == "(*, max_events=65536, max_bytes=16777216, expire_after=300.0)"
    with pytest.raises(TypeError):
        EventLog(10)  # type: ignore[misc]
    log = EventLog(max_events=5, max_bytes=1000, expire_after=0.5)
    assert (log.max_events, log.max_bytes, log.expire_after) == (5, 1000, 0.5)


@pytest.mark.parametrize(
    "limits",
    [{"max_events": 0}, {"max_bytes": 0}, {"expire_after": -1.0}, {"expire_after": math.nan}],
)
def test_out_of_range_limits_raise_invalid_limit(limits):
    with pytest.raises(InvalidLimit) as info:
        EventLog(**limits)
    assert isinstance(info.value, LmspCoreError) and isinstance(info.value, ValueError)


def test_ids_grow_from_one_through_the_ring():  # covers: R6.4-1
    log = EventLog(max_events=3)
    fill(log, 10)
    assert (log.first_id, log.last_id) == (8, 10)
    last, frames = log.frames_after(log.first_id - 1)
    assert last == 10
    assert parsed_ids(frames) == [8, 9, 10]
    assert [e[0] for e in log.entries_after(8)] == [9, 10]
    assert log.frames_after(10) == (10, b"")
    assert log.frames_after(99) == (10, b"")


def test_reading_dropped_events_raises_event_history_expired():  # covers: R6.4-3
    log = EventLog(max_events=3)
    fill(log, 10)
    for read in (log.frames_after, log.entries_after):
        with pytest.raises(EventHistoryExpired) as info:
            read(6)
        assert (info.value.after, info.value.first_id) == (6, 8)
        assert isinstance(info.value, LmspCoreError) and not isinstance(info.value, ValueError)
    with pytest.raises(EventHistoryExpired):
        log.frames_after(0)


def test_byte_bound_keeps_the_newest_event():  # covers: R6.4-3
    probe = EventLog()
    fill(probe, 1)
    frame = probe.retained_bytes
    log = EventLog(max_bytes=frame * 5 // 2)
    fill(log, 4)
    assert (log.first_id, log.retained_bytes) == (3, 2 * frame)
    big = log.append("response.output_item.done", b'{"text":"' + b"x" * (frame * 10) + b'"}')
    assert log.first_id == big and log.retained_bytes > log.max_bytes
    assert parsed_ids(log.frames_after(big - 1)[1]) == [big]


def test_history_expires_after_the_close():  # covers: R6.4-3
    log = EventLog(expire_after=5.0)
    fill(log, 3)
    assert not log.expire_if_due(now=1e9), "an open log never expires by time"
    log.close(now=100.0)
    log.close(now=200.0)
    assert log.expires_at == 105.0, "the first close stands"
    assert not log.expire_if_due(now=104.5)
    assert parsed_ids(log.frames_after(0)[1]) == [1, 2, 3]
    assert log.expire_if_due(now=105.0)
    assert (log.expired, log.closed, log.last_id, log.first_id, log.retained_bytes) == (True, True, 3, 4, 0)
    with pytest.raises(EventHistoryExpired) as info:
        log.frames_after(1)
    assert (info.value.after, info.value.first_id) == (1, 4)
    assert log.frames_after(3) == (3, b""), "a reader that had everything missed nothing"
    assert log.entries_after(3) == []


def test_close_and_expire_default_to_the_monotonic_clock():
    log = EventLog(expire_after=60.0)
    before = time.monotonic()
    log.close()
    after = time.monotonic()
    assert log.expires_at is not None and before + 60.0 <= log.expires_at <= after + 60.0
    assert not log.expire_if_due()
    with pytest.raises(ValueError):
        log.expire_if_due(now=-1.0)


def test_explicit_expire():
    log = EventLog()
    fill(log, 2)
    log.close(now=0.0)
    log.expire()
    assert log.expired and log.last_id == 2
    with pytest.raises(EventHistoryExpired):
        log.entries_after(0)


def test_wait_does_not_register_for_dropped_events():
    log = EventLog(max_events=2)
    fill(log, 5)
    called = []
    assert log.wait(1, lambda: called.append(1)) is False
    assert log.wait(5, lambda: called.append(2)) is True
    log.expire()
    assert called == [2], "expiring an open log wakes its readers"


def test_a_reader_that_falls_behind_wakes_and_gets_410():  # covers: R6.4-3
    log = EventLog(max_events=4)
    fill(log, 1)
    producer = threading.Thread(target=fill, args=(log, 9))

    async def reader() -> None:
        assert await wait_for_events(log, 1, timeout=10)
        # Woken by the first append of a burst that runs past the ring before we read.
        await asyncio.to_thread(producer.join)
        with pytest.raises(EventHistoryExpired):
            log.frames_after(1)
        assert parsed_ids(log.frames_after(log.first_id - 1)[1]) == [7, 8, 9, 10]

    async def main() -> None:
        task = asyncio.ensure_future(reader())
        await asyncio.sleep(0.01)
        assert not task.done(), "nothing to read yet: the reader waits"
        producer.start()
        await task

    asyncio.run(main())


def test_stub_exports_match_the_module():
    stub = ast.parse((Path(__file__).parents[3] / "python/lmsp/_core.pyi").read_text())
    exported = next(
        ast.literal_eval(node.value)
        for node in stub.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
    )
    public = {name for name in dir(core) if not name.startswith("_")}
    assert set(exported) == public
