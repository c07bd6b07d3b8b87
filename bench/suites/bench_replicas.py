"""Several replicas (issue 16): task events fanned out to 200 readers through Redis Streams
against the same through one process's rings, in the same run; and what each shared engine
costs: Redis per event (the owner's XADD, a follower's read), PostgreSQL per commit against the
embedded SQLite store.

Redis and PostgreSQL are real servers started here (lmsp.testing_servers, as in the replica
tests); figures are "not measured" with the reason where their binaries are missing."""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench_tasks import _create, _follow
from figures import KEEP_LOADED, QUICK, SCRIPTED, not_measured
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import missing_servers, postgres_server, redis_server

READERS = 200
TASKS = 4 if QUICK else 10
TOKENS = 300 if QUICK else 2000
EVENTS = TOKENS + 4  # created, item added, TOKENS deltas, item done, incomplete
ENGINE_EVENTS = 5000 if QUICK else 50000
COMMITS = 100 if QUICK else 1000
_MISSING = missing_servers()


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[str, str] | None]:
    if _MISSING is not None:
        yield None
        return
    with redis_server() as redis_url, postgres_server() as postgres_url:
        yield redis_url, postgres_url


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory, shared: tuple[str, str] | None) -> Iterator[RunningServer | None]:
    if shared is None:
        yield None
        return
    redis_url, postgres_url = shared
    srv = start_server(
        tmp_path_factory.mktemp("replica"),
        "--store", postgres_url, "--events", redis_url,
        "--scripted-model", SCRIPTED, "--max-output-tokens", "1000000", *KEEP_LOADED,
    )  # fmt: skip
    yield srv
    srv.stop()


def _fan_out(srv: RunningServer) -> float:
    """Events/s written to READERS readers of TASKS tasks, all created at once."""
    with httpx.Client(base_url=srv.url, timeout=120) as client:
        busy = [_create(client, "!repeat tok", TOKENS) for _ in range(TASKS)]
        started = time.perf_counter()
        readers = asyncio.run(_follow(srv.port, busy, READERS))
        elapsed = time.perf_counter() - started
    assert all(r.events == EVENTS and r.last_id == EVENTS for r in readers), "a reader missed events"
    return READERS * EVENTS / elapsed


def test_fan_out_through_redis_against_in_process(server, replica, figures):
    figures["replicas.readers"] = READERS
    inprocess = _fan_out(server)
    figures["replicas.fanout_inprocess_events_s"] = inprocess
    if replica is None:
        figures["replicas.fanout_redis_events_s"] = not_measured(str(_MISSING))
        figures["replicas.fanout_redis_ratio"] = not_measured(str(_MISSING))
        return
    redis_rate = _fan_out(replica)
    figures["replicas.fanout_redis_events_s"] = redis_rate
    figures["replicas.fanout_redis_ratio"] = redis_rate / inprocess


async def _redis_costs(url: str) -> tuple[float, float]:
    """(µs per event the owner spends carrying a ring to its stream, µs per event a
    follower spends reading it), over ENGINE_EVENTS events of one task."""
    from lmsp._core import EventLog
    from lmsp.events.redis import RedisEvents

    events = RedisEvents(url, max_events=1 << 20, max_bytes=1 << 30, retention=60)
    await events.start()
    try:
        ring = EventLog(max_events=1 << 20, max_bytes=1 << 30)
        head = b'{"response_id":"resp_bench","item_id":"msg_bench","delta":'
        for _ in range(ENGINE_EVENTS - 1):
            ring.append_text("response.output_text.delta", head, "tok ", b"}")
        ring.append("response.incomplete", b'{"response_id":"resp_bench","status":"incomplete"}')
        ring.close()
        started = time.perf_counter()
        await events.publish("task_bench", ring, lambda: None)
        await asyncio.gather(*events._mirrors)
        written = time.perf_counter() - started
        started = time.perf_counter()
        source = await events.source("task_bench", True)
        assert source is not None and source.closed and source.last_id == ENGINE_EVENTS
        read = time.perf_counter() - started
        assert source.frames_after(0) == ring.frames_after(0), "the stream holds other bytes than the ring"
    finally:
        await events.aclose()
    return written / ENGINE_EVENTS * 1e6, read / ENGINE_EVENTS * 1e6


def _commit_ms(store: Any) -> float:
    """Milliseconds per durable write of a task record (a task makes two)."""
    from lmsp.store import StoredTask

    task = {
        "id": "",
        "object": "task",
        "status": "in_progress",
        "created_at": 0,
        "response_id": "resp_x",
        "response": None,
    }
    started = time.perf_counter()
    for i in range(COMMITS):
        store.put_task("bench", StoredTask(task={**task, "id": f"task_{i}"}, model=SCRIPTED, last_event_id=0))
    return (time.perf_counter() - started) / COMMITS * 1000


def test_what_each_engine_costs(shared, figures):
    from lmsp.store import SqliteStore

    with tempfile.TemporaryDirectory() as folder:
        sqlite = SqliteStore(Path(folder) / "bench.sqlite3")
        figures["replicas.sqlite_ms_per_commit"] = _commit_ms(sqlite)
        sqlite.close()
    if shared is None:
        for name in ("redis_write_us_per_event", "redis_read_us_per_event", "postgres_ms_per_commit"):
            figures[f"replicas.{name}"] = not_measured(str(_MISSING))
        return
    redis_url, postgres_url = shared
    from lmsp.store.postgres import PostgresStore

    written, read = asyncio.run(_redis_costs(redis_url))
    figures["replicas.redis_write_us_per_event"] = written
    figures["replicas.redis_read_us_per_event"] = read
    postgres = PostgresStore(postgres_url)
    figures["replicas.postgres_ms_per_commit"] = _commit_ms(postgres)
    postgres.close()
