"""Client.tasks.events over connections cut at random byte offsets (a proxy in the test):
the consumer gets exactly what one uninterrupted read gets, each event once, in order."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from helpers import SCRIPTED, parse_events, read_task_events
from lmsp.client import APIConnectionError, AsyncClient, Client, Event, Retry
from proxy import Cut, Plan, Proxy

CUTS_AT_LEAST = 300
# Reconnect at once: the proxy, not the service, is what fails here. The bound counts
# connections in a row that bring no whole event; the output_item.done frame (the whole text,
# ~3 KB) needs one of the rarer long ones, about 1 in 10, so 100 in a row is ~1e-5 likely.
EAGER = Retry(attempts=100, backoff=0.001, max_backoff=0.01)


def _random_cuts(seed: int) -> Plan:
    rng = random.Random(seed)

    def plan(_n: int) -> Cut:
        # Mostly short (a few events, often mid-frame, mid-header or mid-chunk-size line).
        return Cut(rng.randint(1, 400) if rng.random() < 0.85 else rng.randint(400, 8000))

    return plan


def _uninterrupted(url: str, task_id: str) -> list[tuple[int, str, object]]:
    with httpx.Client(base_url=url, timeout=60) as c:
        _, raw = read_task_events(c, task_id)
    return parse_events(raw)


def test_events_over_hundreds_of_cut_connections_equal_one_read(server, capsys):  # covers: R6.4-1, R6.4-2, R7-3
    compared = 0
    with Proxy(server.port, _random_cuts(20261214)) as proxy, Client(proxy.url, retry=EAGER) as c:
        # One read while the task generates (the live tail, resumed), one of a finished task
        # (the replay, resumed).
        for text in ("!slow 3 " + " ".join(f"w{i}" for i in range(400)), "!repeat tok", "!repeat tak"):
            task = c.tasks.create(model=SCRIPTED, input=text, max_output_tokens=600)
            got = [(e.id, e.type, e.data) for e in c.tasks.events(task.id) if isinstance(e, Event)]
            want = _uninterrupted(server.url, task.id)
            assert got == want
            assert want[-1][1] in ("response.completed", "response.incomplete")
            compared += len(want)
        cuts = proxy.cuts
    with capsys.disabled():
        print(f"\n  tasks.events: {cuts} cut connections survived, {compared} events equal to one uninterrupted read")
    assert cuts >= CUTS_AT_LEAST


def test_async_events_over_cut_connections_equal_one_read(server):  # covers: R6.4-2
    async def read(url: str, task_id: str) -> list[tuple[int, str, object]]:
        async with AsyncClient(url, retry=EAGER) as c:
            return [(e.id, e.type, e.data) async for e in c.tasks.events(task_id) if isinstance(e, Event)]

    with Client(server.url) as c:
        task = c.tasks.create(model=SCRIPTED, input="!repeat tok", max_output_tokens=300)
    with Proxy(server.port, _random_cuts(14)) as proxy:
        got = asyncio.run(read(proxy.url, task.id))
        assert proxy.cuts >= 30
    assert got == _uninterrupted(server.url, task.id)


def test_resuming_gives_up_after_its_bound(server):  # covers: R6.4-2
    with Client(server.url) as c:
        task = c.tasks.create(model=SCRIPTED, input="never heard")
    bound = Retry(attempts=4, backoff=0.001)
    with Proxy(server.port, lambda _n: Cut(1)) as proxy, Client(proxy.url, retry=bound) as c:
        with pytest.raises(APIConnectionError, match="no new event in 5 connections after event 0"):
            list(c.tasks.events(task.id))
        assert proxy.connections == 1 + bound.attempts
