"""Runs a blocking Store on one thread of its own, awaited from the event loop.

SQLite work never runs on the event loop (a commit waits for the disk) nor on a model's
scheduler thread (a token must never wait for the disk); one thread keeps the single
connection's calls in order. A store with a pool of connections (PostgreSQL) gets as many
threads as connections.

Every call has a deadline: a request waits for the store at most `REQUEST_DEADLINE` and is
answered 503 service_unavailable with Retry-After (the call may still finish on its thread; its
result is then dropped). A response's or task's final record waits longer (`FINAL_DEADLINE`):
its readers get keep-alives meanwhile, and an explicit failure after.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ..protocol.errors import unavailable
from .base import IdempotencyRecord, Store, StoredResponse, StoredTask

__all__ = ["FINAL_DEADLINE", "REQUEST_DEADLINE", "StoreWorker"]

T = TypeVar("T")

# Seconds a call may take before whoever awaits it gets 503 (see the module's notes).
REQUEST_DEADLINE = 5.0
FINAL_DEADLINE = 60.0


class StoreWorker:
    def __init__(self, store: Store, threads: int = 1) -> None:
        self.store = store
        self._thread = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lmsp-store")

    async def _call(self, fn: Callable[..., T], *args: Any, deadline: float = REQUEST_DEADLINE) -> T:
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(self._thread, functools.partial(fn, *args))
        try:
            return await asyncio.wait_for(work, deadline)
        except asyncio.TimeoutError:  # Python 3.10's wait_for raises this, not yet the builtin
            raise unavailable("the store") from None

    async def put_response(self, owner: str, stored: StoredResponse) -> None:
        await self._call(self.store.put_response, owner, stored, deadline=FINAL_DEADLINE)

    async def get_response(self, owner: str, response_id: str) -> StoredResponse | None:
        return await self._call(self.store.get_response, owner, response_id)

    async def delete_response(self, owner: str, response_id: str) -> bool:
        return await self._call(self.store.delete_response, owner, response_id)

    async def claim_key(
        self, owner: str, key: str, fingerprint: bytes, now: float, ttl: float
    ) -> IdempotencyRecord | None:
        return await self._call(self.store.claim_key, owner, key, fingerprint, now, ttl)

    async def finish_key(self, owner: str, key: str, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        await self._call(self.store.finish_key, owner, key, status, headers, body, deadline=FINAL_DEADLINE)

    async def release_key(self, owner: str, key: str) -> None:
        await self._call(self.store.release_key, owner, key)

    async def put_task(self, owner: str, stored: StoredTask, deadline: float = FINAL_DEADLINE) -> None:
        """`deadline`: REQUEST_DEADLINE for a record a request waits for (a new task)."""
        await self._call(self.store.put_task, owner, stored, deadline=deadline)

    async def get_task(self, owner: str, task_id: str) -> StoredTask | None:
        return await self._call(self.store.get_task, owner, task_id)

    async def heartbeat(self, now: float) -> None:
        await self._call(self.store.heartbeat, now)

    async def running_tasks(self) -> list[tuple[str, StoredTask]]:
        return await self._call(self.store.running_tasks)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.store.close()
