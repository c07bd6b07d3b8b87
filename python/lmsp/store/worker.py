"""Runs a blocking Store on one thread of its own, awaited from the event loop.

SQLite work never runs on the event loop (a commit waits for the disk) nor on a model's
scheduler thread (a token must never wait for the disk); one thread keeps the single
connection's calls in order. A store with a pool of connections (PostgreSQL) gets as many
threads as connections.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .base import IdempotencyRecord, Store, StoredResponse, StoredTask

__all__ = ["StoreWorker"]

T = TypeVar("T")


class StoreWorker:
    def __init__(self, store: Store, threads: int = 1) -> None:
        self.store = store
        self._thread = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lmsp-store")

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, functools.partial(fn, *args))

    async def put_response(self, owner: str, stored: StoredResponse) -> None:
        await self._call(self.store.put_response, owner, stored)

    async def get_response(self, owner: str, response_id: str) -> StoredResponse | None:
        return await self._call(self.store.get_response, owner, response_id)

    async def delete_response(self, owner: str, response_id: str) -> bool:
        return await self._call(self.store.delete_response, owner, response_id)

    async def claim_key(
        self, owner: str, key: str, fingerprint: bytes, now: float, ttl: float
    ) -> IdempotencyRecord | None:
        return await self._call(self.store.claim_key, owner, key, fingerprint, now, ttl)

    async def finish_key(self, owner: str, key: str, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        await self._call(self.store.finish_key, owner, key, status, headers, body)

    async def release_key(self, owner: str, key: str) -> None:
        await self._call(self.store.release_key, owner, key)

    async def put_task(self, owner: str, stored: StoredTask) -> None:
        await self._call(self.store.put_task, owner, stored)

    async def get_task(self, owner: str, task_id: str) -> StoredTask | None:
        return await self._call(self.store.get_task, owner, task_id)

    async def heartbeat(self, now: float) -> None:
        await self._call(self.store.heartbeat, now)

    async def running_tasks(self) -> list[tuple[str, StoredTask]]:
        return await self._call(self.store.running_tasks)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.store.close()
