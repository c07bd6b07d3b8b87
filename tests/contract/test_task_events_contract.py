"""The task events' contract (lmsp/events/base.py `TaskEvents`), on every backend: a task's
ring, once published, is read through `source` the same way wherever its events are kept —
replay after N, live events, the end, the ring's bounds, expiry — and a task is cancelled,
found abandoned and taken over through the same calls. Through the interface only: the owner
side writes the ring (as the engine does), the reader side sees only an EventSource."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from lmsp._core import EventHistoryExpired, EventLog
from lmsp.events import EventSource, TaskEvents
from lmsp.events.wait import wait_for_events
from lmsp.protocol import events as ev
from lmsp.state import StateConfig, backend

# Long enough for a shared backend's round trips on a loaded machine; the in-process one
# answers at once.
PATIENCE = 10.0


@asynccontextmanager
async def _opened(url: str, config: StateConfig) -> AsyncIterator[TaskEvents]:
    factory = backend(url).events
    assert factory is not None
    events = factory(url, config)
    await events.start()
    try:
        yield events
    finally:
        await events.aclose()


def _run(events_url: str, config: StateConfig, scenario: Callable[[TaskEvents], Awaitable[None]]) -> None:
    async def main() -> None:
        async with _opened(events_url, config) as events:
            await asyncio.wait_for(scenario(events), 60)

    asyncio.run(main())


def _ring(config: StateConfig) -> EventLog:
    """A task's ring as the service makes it: the bounds a shared copy keeps too."""
    return EventLog(
        max_events=config.task_events_max, max_bytes=config.task_events_bytes, expire_after=config.task_retention
    )


def _task_id() -> str:
    return f"task_{uuid.uuid4().hex}"


_seq = itertools.count(1)


def _append(ring: EventLog, event: str = ev.TEXT_DELTA) -> int:
    return ring.append(event, b'{"n":%d}' % next(_seq))


def _finish(ring: EventLog) -> int:
    last = ring.append(ev.COMPLETED, b'{"status":"completed"}')
    ring.close()
    return last


def _no_cancel() -> None:
    pass


async def _until(source: EventSource, done: Callable[[], bool]) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while not done():
        left = deadline - loop.time()
        if left <= 0:
            pytest.fail(f"the source did not get there in {PATIENCE} s (last id {source.last_id})")
        await wait_for_events(source, source.last_id, left)


async def _kept(events: TaskEvents, task_id: str) -> EventSource:
    """The source of a task that has ended, once its events are kept where readers read them
    (a shared copy is written a moment after the owner's ring)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE
    while (source := await events.source(task_id, True)) is None:
        if loop.time() > deadline:
            pytest.fail(f"the ended task's events were not kept within {PATIENCE} s")
        await asyncio.sleep(0.02)
    return source


async def _source(events: TaskEvents, task_id: str, final: bool = False) -> EventSource:
    source = await events.source(task_id, final)
    assert source is not None
    return source


def test_a_published_ring_is_read_live_and_replayed_after_n(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        _append(ring, ev.CREATED)
        _append(ring)
        source = await _source(events, task_id)
        await _until(source, lambda: source.last_id >= 2)
        assert not source.closed and source.first_id == 1
        for after in (0, 1, 2):
            assert source.frames_after(after) == ring.frames_after(after)
            # A bounded read (a measured reader's slice): whole frames, the first always.
            for limit in (1, len(ring.frames_after(0)[1]) - 1, 1 << 20):
                assert source.frames_after(after, limit) == ring.frames_after(after, limit)
        assert source.frames_after(0, 1)[0] == 1
        assert source.frames_after(2) == (2, b"")
        _append(ring)
        await _until(source, lambda: source.last_id >= 3)  # live: a reader waiting is woken
        assert source.frames_after(2) == ring.frames_after(2)

    _run(events_url, config, scenario)


def test_the_final_event_closes_the_source(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        _append(ring, ev.CREATED)
        source = await _source(events, task_id)
        last = _finish(ring)
        await _until(source, lambda: source.closed)
        assert source.last_id == last
        assert source.frames_after(0) == ring.frames_after(0)
        assert source.frames_after(last) == (last, b"")
        assert source.wait(last, _no_cancel) is False  # nothing more will come: not registered
        assert await events.newest(task_id, source) == last

    _run(events_url, config, scenario)


def test_a_reader_arriving_after_the_end_reads_it_all(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        _append(ring, ev.CREATED)
        _append(ring)
        last = _finish(ring)
        source = await _kept(events, task_id)
        await _until(source, lambda: source.closed)
        assert source.first_id == 1 and source.last_id == last
        assert source.frames_after(0) == ring.frames_after(0)

    _run(events_url, config, scenario)


def test_wait_registers_only_while_there_is_nothing_to_read(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        _append(ring)
        source = await _source(events, task_id)
        await _until(source, lambda: source.last_id >= 1)
        assert source.wait(0, _no_cancel) is False  # event 1 is there to read
        woken = asyncio.Event()
        assert source.wait(1, lambda: asyncio.get_running_loop().call_soon_threadsafe(woken.set)) is True
        _append(ring)
        await asyncio.wait_for(woken.wait(), PATIENCE)
        assert source.last_id == 2

    _run(events_url, config, scenario)


def test_events_the_ring_dropped_are_gone_for_readers_too(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        for _ in range(config.task_events_max + 4):
            _append(ring)
        source = await _source(events, task_id)
        await _until(source, lambda: source.last_id >= config.task_events_max + 4)
        assert ring.first_id == 5 and source.first_id == ring.first_id
        with pytest.raises(EventHistoryExpired):
            source.frames_after(ring.first_id - 2)
        assert source.frames_after(ring.first_id - 1) == ring.frames_after(ring.first_id - 1)
        assert await events.newest(task_id, source) == ring.last_id

    _run(events_url, config, scenario)


def test_newest_is_never_behind_what_a_reader_read(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        source = await _source(events, task_id)
        for expected in range(1, 4):
            _append(ring)
            await _until(source, lambda: source.last_id >= expected)  # noqa: B023  # awaited here
            assert await events.newest(task_id, source) >= source.last_id

    _run(events_url, config, scenario)


def test_events_expire_after_the_retention_time(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        _append(ring)
        source = await _source(events, task_id)
        _finish(ring)
        closed_at = time.monotonic()
        await _until(source, lambda: source.closed)
        assert await events.source(task_id, True) is not None  # kept for the retention time
        deadline = closed_at + config.task_retention + PATIENCE
        while time.monotonic() < deadline:
            ring.expire_if_due()  # its owner drops the ring when due, as the service does
            if await events.source(task_id, True) is None:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"its events were still kept {PATIENCE} s after the retention time")
        assert time.monotonic() - closed_at >= config.task_retention * 0.9

    _run(events_url, config, scenario)


def test_a_task_never_published_has_no_events(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        assert await events.source(_task_id(), True) is None

    _run(events_url, config, scenario)


def test_request_cancel_reaches_the_task_run(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        ring, task_id, cancelled = _ring(config), _task_id(), asyncio.Event()
        await events.publish(task_id, ring, cancelled.set)
        _append(ring)
        await events.request_cancel(_task_id())  # an unknown task: nothing to cancel, no error
        await events.request_cancel(task_id)
        await asyncio.wait_for(cancelled.wait(), PATIENCE)

    _run(events_url, config, scenario)


def test_only_tasks_no_live_process_runs_are_abandoned(events_url: str, config: StateConfig) -> None:
    # A shared backend trusts a lease gap only once it lasted a lease (a restart or FLUSHALL
    # of Redis loses every lease at once): asked again, it says so within a lease or two.
    config = dataclasses.replace(config, task_lease=1.0)

    async def scenario(events: TaskEvents) -> None:
        assert events.lease > 0
        ring, running, left = _ring(config), _task_id(), _task_id()
        await events.publish(running, ring, _no_cancel)
        _append(ring)
        assert await events.abandoned([]) == []
        deadline = time.monotonic() + 2 * config.task_lease + PATIENCE
        while (found := await events.abandoned([running, left])) != [left]:
            assert found == [], found  # never the running one
            assert time.monotonic() < deadline, "the task nobody runs was never found abandoned"
            await asyncio.sleep(0.1)

    _run(events_url, config, scenario)


def test_an_abandoned_task_is_taken_over_once(events_url: str, config: StateConfig) -> None:
    async def scenario(events: TaskEvents) -> None:
        left = _task_id()
        claim = await events.take_over(left)
        assert claim is not None
        last_id, _ = claim
        assert last_id == 0  # none of its events is kept: it never published any here
        assert await events.take_over(left) is None  # another sweep, or another replica's

    _run(events_url, config, scenario)


def test_unpublish_of_an_ended_task_leaves_no_copy_anywhere(events_url: str, config: StateConfig) -> None:
    # What DELETE of its response relies on (issue 28): the shared copy goes too, for every
    # replica, not only this process's ring.
    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        _append(ring, ev.CREATED)
        _finish(ring)
        async with _opened(events_url, config) as other:  # another replica, where one is shared
            await _kept(events, task_id)
            await asyncio.sleep(0.2)  # a shared copy's last batch has landed
            shared = await other.source(task_id, True) is not None
            assert shared == events_url.startswith("redis")  # the other replica read it before
            await events.unpublish(task_id)
            assert await events.source(task_id, True) is None
            assert await other.source(task_id, True) is None

    _run(events_url, config, scenario)


def _ended(source: EventSource) -> bool:
    """A reader part-way through the source gets event_history_expired at its next read."""
    try:
        source.frames_after(1)
    except EventHistoryExpired:
        return True
    return False


def test_unpublish_ends_a_reader_already_attached_to_another_replicas_copy(
    events_url: str, config: StateConfig
) -> None:
    # Issue 28: a DELETE on any replica ends the readers of every copy at their next read (as
    # the owner's own readers end when it expires the ring), not when they disconnect.
    if not events_url.startswith("redis"):
        pytest.skip("one process: the ring is the only copy, and the owner expires it (service/tasks.py)")

    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        for _ in range(4):
            _append(ring)
        last = _finish(ring)
        async with _opened(events_url, config) as other, _opened(events_url, config) as third:
            await _kept(events, task_id)
            await asyncio.sleep(0.2)  # the shared copy's last batch has landed
            reader = await other.source(task_id, True)  # a reader on another replica, mid-way
            assert reader is not None and reader.last_id == last and reader.frames_after(1)[1]
            woken = asyncio.Event()
            assert reader.wait(last, woken.set) is False  # ended: nothing to wait for

            await third.unpublish(task_id)  # the DELETE reached a third replica
            loop = asyncio.get_running_loop()
            deadline = loop.time() + PATIENCE
            while not (_ended(reader) and _ended(ring)):  # the copy, and the owner's ring too
                assert loop.time() < deadline, "the attached readers were not ended"
                await asyncio.sleep(0.02)
            assert reader.closed and reader.frames_after(last) == (last, b"")  # one at the end: the end
            assert await other.source(task_id, True) is None  # a new reader finds none

    _run(events_url, config, scenario)


def test_unpublish_wakes_a_reader_waiting_on_another_replicas_copy(events_url: str, config: StateConfig) -> None:
    # A reader waiting at the live end of a running task's copy is woken and ends.
    if not events_url.startswith("redis"):
        pytest.skip("one process: the ring is the only copy, and the owner expires it (service/tasks.py)")

    async def scenario(events: TaskEvents) -> None:
        ring, task_id = _ring(config), _task_id()
        await events.publish(task_id, ring, _no_cancel)
        first = _append(ring)
        async with _opened(events_url, config) as other:
            reader = await _source(other, task_id)
            await _until(reader, lambda: reader.last_id >= first)
            woken = asyncio.Event()
            assert reader.wait(reader.last_id, woken.set) is True
            await events.unpublish(task_id)
            await asyncio.wait_for(woken.wait(), PATIENCE)
            assert reader.closed
            assert reader.frames_after(reader.last_id) == (reader.last_id, b"")

    _run(events_url, config, scenario)
