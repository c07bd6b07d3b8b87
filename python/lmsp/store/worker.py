"""Runs a blocking Store on one thread of its own, awaited from the event loop.

SQLite work never runs on the event loop (a commit waits for the disk) nor on a model's
scheduler thread (a token must never wait for the disk); one thread keeps the single
connection's calls in order. A store with a pool of connections (PostgreSQL) gets as many
threads as connections.

Every call has a deadline: a request waits for the store at most `REQUEST_DEADLINE` and is
answered 503 service_unavailable with Retry-After (the call may still finish on its thread; its
result is then dropped). A response's or task's final record waits longer (`FINAL_DEADLINE`):
its readers get keep-alives meanwhile, and an explicit failure after.

An `Idempotency-Key` must never stay claimed by a request that was answered 503: a claim that
lands after its deadline is released as soon as it does, and a release that fails is retried
in the background (with backoff, for up to `RELEASE_FOR`), not left to block retries for a day.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
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
# How long a failed release is retried, and the backoff between tries (first, longest).
RELEASE_FOR = 600.0
_RELEASE_BACKOFF_S = (0.5, 10.0)

log = logging.getLogger(__name__)


class StoreWorker:
    def __init__(self, store: Store, threads: int = 1) -> None:
        self.store = store
        self._thread = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lmsp-store")
        self._releasing: set[asyncio.Task[None]] = set()

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

    async def response_tasks(self, owner: str, response_id: str) -> list[str]:
        return await self._call(self.store.response_tasks, owner, response_id)

    async def expire_responses(self, before: int) -> int:
        # A background sweep, not a request: it may wait as long as a final record.
        return await self._call(self.store.expire_responses, before, deadline=FINAL_DEADLINE)

    async def trim_responses(self, owner: str, keep: int) -> int:
        return await self._call(self.store.trim_responses, owner, keep, deadline=FINAL_DEADLINE)

    async def trim_response_bytes(self, owner: str, max_bytes: int) -> int:
        return await self._call(self.store.trim_response_bytes, owner, max_bytes, deadline=FINAL_DEADLINE)

    async def trim_tasks(self, owner: str, keep: int) -> int:
        return await self._call(self.store.trim_tasks, owner, keep, deadline=FINAL_DEADLINE)

    async def trim_task_bytes(self, owner: str, max_bytes: int) -> int:
        return await self._call(self.store.trim_task_bytes, owner, max_bytes, deadline=FINAL_DEADLINE)

    async def claim_key(
        self, owner: str, key: str, fingerprint: bytes, now: float, ttl: float
    ) -> IdempotencyRecord | None:
        loop = asyncio.get_running_loop()
        work = loop.run_in_executor(
            self._thread, functools.partial(self.store.claim_key, owner, key, fingerprint, now, ttl)
        )
        try:
            return await asyncio.wait_for(asyncio.shield(work), REQUEST_DEADLINE)
        except asyncio.TimeoutError:
            # Answered 503: if the claim still lands, it is this request's, and nobody's now.
            def landed(done: asyncio.Future[IdempotencyRecord | None]) -> None:
                if not done.cancelled() and done.exception() is None and done.result() is None:
                    self._release_later(owner, key)

            work.add_done_callback(landed)
            raise unavailable("the store") from None

    async def finish_key(self, owner: str, key: str, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        await self._call(self.store.finish_key, owner, key, status, headers, body, deadline=FINAL_DEADLINE)

    async def release_key(self, owner: str, key: str) -> None:
        """Frees the claim now, or, when the store is away, in the background."""
        try:
            await self._call(self.store.release_key, owner, key)
        except Exception as exc:
            log.warning("releasing an idempotency key: %s; retrying in the background", exc)
            self._release_later(owner, key)

    def _release_later(self, owner: str, key: str) -> None:
        task = asyncio.ensure_future(self._keep_releasing(owner, key))
        self._releasing.add(task)
        task.add_done_callback(self._releasing.discard)

    async def _keep_releasing(self, owner: str, key: str) -> None:
        delay, give_up_at = _RELEASE_BACKOFF_S[0], time.monotonic() + RELEASE_FOR
        while time.monotonic() < give_up_at:
            try:
                await self._call(self.store.release_key, owner, key, deadline=FINAL_DEADLINE)
                return
            except Exception:
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RELEASE_BACKOFF_S[1])
        log.error("could not release an idempotency key for %s s; it expires with its TTL", int(RELEASE_FOR))

    async def put_task(self, owner: str, stored: StoredTask, deadline: float = FINAL_DEADLINE) -> None:
        """`deadline`: REQUEST_DEADLINE for a record a request waits for (a new task)."""
        await self._call(self.store.put_task, owner, stored, deadline=deadline)

    async def get_task(self, owner: str, task_id: str) -> StoredTask | None:
        return await self._call(self.store.get_task, owner, task_id)

    async def heartbeat(self, now: float) -> None:
        await self._call(self.store.heartbeat, now)

    async def ping(self) -> None:
        """Within the deadline any request gets: past it, requests are being answered 503."""
        await self._call(self.store.ping)

    async def running_tasks(self) -> list[tuple[str, StoredTask]]:
        return await self._call(self.store.running_tasks)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self.store.close()
