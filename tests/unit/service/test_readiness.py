"""service/readiness.py: the reasons `GET /ready` gives, from pings that fail and recover, and
the drain and loading flags; the SQLite store's and the in-process events' own pings (the shared ones are
held to it in tests/e2e/test_drain.py, with Redis and PostgreSQL really away)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from lmsp.events.inprocess import InProcessEvents
from lmsp.service.readiness import DRAINING, LOADING, Readiness
from lmsp.state import StateConfig, open_state


class _Away:
    """A server that is reachable or not, as the test says."""

    def __init__(self) -> None:
        self.away = False

    async def ping(self) -> None:
        if self.away:
            raise ConnectionError("connection refused")


def test_a_failing_ping_is_a_reason_until_it_answers_again() -> None:
    store, events = _Away(), _Away()
    readiness = Readiness([("store_unreachable", store.ping), ("events_unreachable", events.ping)])

    async def rounds() -> list[list[str]]:
        seen = []
        for store.away, events.away in [(False, False), (False, True), (True, True), (False, False)]:
            await readiness.check()
            seen.append(readiness.reasons())
        readiness.draining = True
        events.away = True
        await readiness.check()
        seen.append(readiness.reasons())
        return seen

    assert asyncio.run(rounds()) == [
        [],
        ["events_unreachable"],
        ["events_unreachable", "store_unreachable"],
        [],
        [DRAINING, "events_unreachable"],
    ]


def test_loading_is_a_reason_until_the_preloads_have_loaded() -> None:
    events = _Away()
    readiness = Readiness([("events_unreachable", events.ping)])
    readiness.loading = True
    assert readiness.reasons() == [LOADING]
    events.away = True
    asyncio.run(readiness.check())
    readiness.draining = True
    assert readiness.reasons() == [DRAINING, LOADING, "events_unreachable"]
    readiness.loading = readiness.draining = events.away = False
    asyncio.run(readiness.check())
    assert readiness.reasons() == []


def test_the_background_rounds_start_and_stop() -> None:
    events = _Away()
    events.away = True
    readiness = Readiness([("events_unreachable", events.ping)], period=0.01)

    async def run() -> list[str]:
        readiness.start()
        await asyncio.sleep(0.05)
        seen = readiness.reasons()
        await readiness.aclose()
        return seen

    assert asyncio.run(run()) == ["events_unreachable"]


def test_the_embedded_backends_answer_their_ping(tmp_path: Path) -> None:
    state = open_state(StateConfig(data_dir=tmp_path))
    try:
        readiness = Readiness([("store_unreachable", state.store.ping), ("events_unreachable", state.events.ping)])
        asyncio.run(readiness.check())
        assert readiness.reasons() == []
        assert isinstance(state.events, InProcessEvents)
    finally:
        state.close()
