"""Many readers following tasks through the real server (issue 5): every reader gets every
event; aggregate events/s written to all readers, and the server's memory per idle reader.

Readers are raw asyncio sockets in this process (one httpx client each would cost more here
than the server spends on them); tasks come from the scripted backend."""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any

import httpx

from figures import QUICK, SCRIPTED
from procstat import raise_open_files, rss_kib

READERS = 200 if QUICK else 1000
TASKS = 10 if QUICK else 20
TOKENS = 1000 if QUICK else 2000
EVENTS = TOKENS + 4  # created, item added, TOKENS deltas, item done, incomplete

raise_open_files()

_LAST = re.compile(rb"id: (\d+)\nevent: response\.(?:incomplete|cancelled)\n")


def _user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


def _create(client: httpx.Client, text: str, max_tokens: int) -> str:
    created = client.post(
        "/lmsp/v1/tasks", json={"model": SCRIPTED, "input": _user(text), "max_output_tokens": max_tokens}
    )
    assert created.status_code == 202, created.text
    return str(created.json()["id"])


class Reader:
    """Follows one task's events to the end, counting frames and keeping the last id."""

    def __init__(self, port: int, task_id: str) -> None:
        self.port = port
        self.task_id = task_id
        self.events = 0
        self.last_id = 0
        self.started = asyncio.Event()  # the first event arrived: the reader is attached

    async def run(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        writer.write(f"GET /lmsp/v1/tasks/{self.task_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        carry = b""
        try:
            while True:
                chunk = await reader.read(262144)
                if not chunk:
                    break
                joined = carry + chunk
                # `id: ` begins every frame and nothing else (the JSON is compact).
                self.events += joined.count(b"id: ") - carry.count(b"id: ")
                self.started.set()
                # Enough to hold the whole final event, where the last id is read from.
                carry = joined[-1024:]
                if joined.endswith(b"\r\n0\r\n\r\n"):
                    break
        finally:
            writer.close()
        if m := list(_LAST.finditer(carry)):
            self.last_id = int(m[-1].group(1))


async def _follow(port: int, task_ids: list[str], n: int) -> list[Reader]:
    readers = [Reader(port, task_ids[i % len(task_ids)]) for i in range(n)]
    running = [asyncio.ensure_future(r.run()) for r in readers]
    await asyncio.gather(*running)
    return readers


async def _idle(port: int, pid: int, task_ids: list[str], n: int, cancel: Any) -> float:
    """KiB of server memory per reader attached to a task that is silent."""
    readers = [Reader(port, task_ids[i % len(task_ids)]) for i in range(n)]
    await asyncio.sleep(0.5)
    before = rss_kib(pid)
    running = [asyncio.ensure_future(r.run()) for r in readers]
    await asyncio.gather(*(r.started.wait() for r in readers))
    await asyncio.sleep(0.5)  # the last writes settle
    after = rss_kib(pid)
    await asyncio.to_thread(cancel)
    await asyncio.gather(*running)
    assert all(r.last_id > 0 for r in readers), "every idle reader sees its task cancelled"
    return (after - before) / n


def test_many_readers_follow_tasks(server, figures):
    pid = server.proc.pid
    with httpx.Client(base_url=server.url, timeout=120) as client:
        # Idle: tasks that wait a minute between words; readers attach, get the first events, wait.
        idle = [_create(client, "!slow 60000 a b", 10) for _ in range(TASKS)]

        def cancel() -> None:
            for task_id in idle:
                assert client.post(f"/lmsp/v1/tasks/{task_id}/cancel").json()["status"] == "cancelled"

        per_reader_kib = asyncio.run(_idle(server.port, pid, idle, READERS, cancel))

        busy = [_create(client, "!repeat tok", TOKENS) for _ in range(TASKS)]
        started = time.perf_counter()
        readers = asyncio.run(_follow(server.port, busy, READERS))
        elapsed = time.perf_counter() - started
    assert all(r.events == EVENTS and r.last_id == EVENTS for r in readers), "a reader missed events"
    figures["tasks.readers"] = READERS
    figures["tasks.events_per_s_written"] = READERS * EVENTS / elapsed
    figures["tasks.idle_reader_kib"] = per_reader_kib
