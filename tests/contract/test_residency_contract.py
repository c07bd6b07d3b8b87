"""The residency's contract (lmsp/events/residency.py `Residency`), on every task-event backend:
what one replica announces (its URL, its models, busy or not, the conversations it served last)
its sibling reads as written, replaced by the next announcement, gone at once when withdrawn
and by itself once its TTL passes unrenewed; an entry not as written is skipped. Two replicas
are two residencies on one medium: the in-process one's board, or one Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from lmsp.events.residency import MAX_KEYS, InProcessResidency, Residence, Residency
from lmsp.state import StateConfig, backend

TTL = 0.6


@asynccontextmanager
async def _pair(url: str, config: StateConfig) -> AsyncIterator[tuple[Residency, Residency]]:
    """Two replicas' residencies on one medium, opened as the service opens them."""
    factory = backend(url).residency
    assert factory is not None
    first = factory(url, config)
    # In one process the board is the medium: the second "replica" writes on the first's.
    second = InProcessResidency(first.board, TTL) if isinstance(first, InProcessResidency) else factory(url, config)
    for residency in (first, second):
        residency.ttl = TTL  # type: ignore[misc]  # both backends keep it as a plain attribute
    try:
        yield first, second
    finally:
        await first.aclose()
        await second.aclose()


def _mine(entries: list[Residence], *replicas: str) -> dict[str, Residence]:
    """The entries of this test's replicas (a shared Redis may hold other tests' for a moment)."""
    return {e.replica: e for e in entries if e.replica in replicas}


def _ids() -> tuple[str, str]:
    return uuid.uuid4().hex, uuid.uuid4().hex


def test_an_announcement_is_read_by_a_sibling_as_written(events_url: str, config: StateConfig) -> None:
    async def main() -> None:
        async with _pair(events_url, config) as (a, b):
            ra, rb = _ids()
            keys = tuple(f"{i:032x}" for i in range(MAX_KEYS))  # as many as an entry holds
            await a.announce(Residence(ra, "http://10.0.0.11:8750", ("smol:a", "smol:b"), busy=False, keys=keys))
            await b.announce(Residence(rb, "http://10.0.0.12:8750", (), busy=True))
            seen_by_b = _mine(await b.entries(), ra, rb)
            assert seen_by_b[ra] == Residence(ra, "http://10.0.0.11:8750", ("smol:a", "smol:b"), False, keys)
            assert seen_by_b[rb] == Residence(rb, "http://10.0.0.12:8750", (), True)
            assert _mine(await a.entries(), ra, rb) == seen_by_b

    asyncio.run(main())


def test_the_next_announcement_replaces_the_last(events_url: str, config: StateConfig) -> None:
    async def main() -> None:
        async with _pair(events_url, config) as (a, b):
            ra, _ = _ids()
            await a.announce(Residence(ra, "http://a:1", ("smol:a",)))
            await a.announce(Residence(ra, "http://a:1", ("smol:c",), busy=True))
            assert _mine(await b.entries(), ra) == {ra: Residence(ra, "http://a:1", ("smol:c",), True)}

    asyncio.run(main())


def test_an_entry_lapses_unrenewed_and_stays_while_renewed(events_url: str, config: StateConfig) -> None:
    async def main() -> None:
        async with _pair(events_url, config) as (a, b):
            ra, rb = _ids()
            await a.announce(Residence(ra, "http://a:1", ("smol:a",)))
            await b.announce(Residence(rb, "http://b:1", ("smol:b",)))
            deadline = time.monotonic() + 3 * TTL
            while time.monotonic() < deadline:  # b keeps renewing; a says nothing more
                await b.announce(Residence(rb, "http://b:1", ("smol:b",)))
                await asyncio.sleep(TTL / 4)
            assert set(_mine(await b.entries(), ra, rb)) == {rb}
            assert set(_mine(await a.entries(), ra, rb)) == {rb}

    asyncio.run(main())


def test_a_withdrawn_entry_is_gone_at_once(events_url: str, config: StateConfig) -> None:
    async def main() -> None:
        async with _pair(events_url, config) as (a, b):
            ra, rb = _ids()
            await a.announce(Residence(ra, "http://a:1", ("smol:a",)))
            await b.announce(Residence(rb, "http://b:1"))
            await a.withdraw(ra)
            assert set(_mine(await b.entries(), ra, rb)) == {rb}

    asyncio.run(main())


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"[]",
        b'{"replica": "r", "url": "http://a:1", "models": "smol:a", "busy": false, "keys": []}',
        b'{"replica": "r", "url": "http://a:1", "models": [1], "busy": false, "keys": []}',
        b'{"replica": "r", "url": "file:///etc/passwd", "models": [], "busy": false, "keys": []}',
        b'{"replica": "r", "url": "http://a:1", "models": [], "keys": []}',
        b'{"replica": "r", "url": "http://a:1", "models": [], "busy": false}',
        b'{"replica": "r", "url": "http://a:1", "models": [], "busy": false, "keys": ["not a hash"]}',
        b'{"replica": "r", "url": "http://a:1", "models": [], "busy": false, "keys": [' + b'"' + b"A" * 32 + b'"]}',
        # More conversations than an entry holds: a foreign writer's, whose size nobody bounded.
        Residence("r", "http://a:1", keys=tuple(f"{i:032x}" for i in range(MAX_KEYS + 1))).encode(),
    ],
)
def test_an_entry_not_as_written_is_skipped(raw: bytes) -> None:
    assert Residence.decode(raw) is None
    assert Residence.decode(Residence("r", "http://a:1", ("m",)).encode()) == Residence("r", "http://a:1", ("m",))
