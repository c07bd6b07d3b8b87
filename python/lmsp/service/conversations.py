"""Stored conversations (R6.1-5..7, R6.2-6): keeping finished responses and reading them back.

State lives in the store, never in a connection (R6.1-7): a continuation can come on any
connection, from any client, after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..protocol.errors import ProblemError
from ..store import StoredResponse, StoreWorker

__all__ = [
    "DEFAULT_STORE_QUOTA",
    "DEFAULT_STORE_QUOTA_BYTES",
    "DEFAULT_STORE_RETENTION",
    "Conversations",
    "sweep_interval",
]

# How long a stored response is kept (--store-retention; 0 or less: for ever), and how many one
# owner keeps (--store-quota; 0: no bound): a client that stores every call must not fill the
# disk (issue 28).
DEFAULT_STORE_RETENTION = 30 * 86400.0
DEFAULT_STORE_QUOTA = 10_000
# And how many bytes (--store-quota-bytes; 0: no bound): the count alone lets one owner keep
# 10,000 context windows of input, each call storing a long input again for one token out.
DEFAULT_STORE_QUOTA_BYTES = 1 << 30

# A failed trim is tried again after this long, doubling up to the second figure.
_TRIM_BACKOFF_S = (1.0, 60.0)

log = logging.getLogger(__name__)


def sweep_interval(retention: float) -> float:
    """Seconds between retention sweeps: a tenth of the retention, so that nothing outlives it
    by more than 10 %, within [1 s, 1 h] (a sweep is one indexed DELETE)."""
    return min(max(retention / 10, 1.0), 3600.0)


class Conversations:
    def __init__(
        self,
        store: StoreWorker,
        *,
        retention: float = DEFAULT_STORE_RETENTION,
        quota: int = DEFAULT_STORE_QUOTA,
        quota_bytes: int = DEFAULT_STORE_QUOTA_BYTES,
    ) -> None:
        self.store = store
        self.retention = retention
        self.quota = quota
        self.quota_bytes = quota_bytes
        self._sweeper: asyncio.Task[None] | None = None
        self._trimming: set[str] = set()  # owners whose trim failed, retried in the background
        self._retries: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """On the serving loop: the retention sweep, at once and then every `sweep_interval`."""
        if self.retention > 0 and self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_forever())

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for task in list(self._retries):
            task.cancel()

    async def sweep(self) -> int:
        """Forgets every stored response and final task record older than the retention (and
        the finished idempotency records); returns how many responses and task records."""
        return await self.store.expire_responses(int(time.time() - self.retention))

    async def _sweep_forever(self) -> None:
        while True:
            try:
                if gone := await self.sweep():
                    log.info(
                        "retention: forgot %d stored responses and task records older than %d s",
                        gone,
                        int(self.retention),
                    )
            except Exception:  # the store away for a moment: the next round retries
                log.exception("could not sweep stored responses")
            await asyncio.sleep(sweep_interval(self.retention))

    async def history(self, owner: str, previous_response_id: str) -> list[dict[str, Any]]:
        """The items a continuation starts from: the stored response's input, then its output."""
        stored = await self.store.get_response(owner, previous_response_id)
        if stored is None:
            raise ProblemError(
                "response_not_found",
                f"no stored response {previous_response_id!r} (was it created with store: true?)",
                param="previous_response_id",
            )
        return [*stored.input, *stored.response["output"]]

    async def keep(self, owner: str, response: dict[str, Any], items: Sequence[Mapping[str, Any]]) -> None:
        await self.store.put_response(owner, StoredResponse(response=response, input=[dict(i) for i in items]))
        await self.bound(owner)

    async def bound(self, owner: str) -> None:
        """Holds the owner's stored responses and task records to the quotas. Never raises: the
        record it follows is kept already, and a failed trim is no reason to tell its client
        otherwise (issue 38); it is logged and tried again in the background."""
        try:
            await self._trim(owner)
        except Exception as exc:
            log.warning("could not hold %s to the store quotas (%s); trying again in the background", owner, exc)
            self._trim_later(owner)

    async def _trim(self, owner: str) -> None:
        # Past the quota the owner's oldest go, not this one: a client that stores every call
        # keeps working, and its latest conversations stay continuable. Task records (whole
        # responses, `store: false` ones too) are counted apart, by the same bounds.
        if self.quota > 0:
            await self.store.trim_responses(owner, self.quota)
            await self.store.trim_tasks(owner, self.quota)
        if self.quota_bytes > 0:
            # The same for bytes; the newest stays even when it alone is past the bound.
            await self.store.trim_response_bytes(owner, self.quota_bytes)
            await self.store.trim_task_bytes(owner, self.quota_bytes)

    def _trim_later(self, owner: str) -> None:
        if owner in self._trimming:  # one retry per owner at a time: it trims to the bound anyway
            return
        self._trimming.add(owner)
        task = asyncio.ensure_future(self._keep_trimming(owner))
        self._retries.add(task)
        task.add_done_callback(self._retries.discard)

    async def _keep_trimming(self, owner: str) -> None:
        delay = _TRIM_BACKOFF_S[0]
        try:
            while True:
                await asyncio.sleep(delay)
                try:
                    await self._trim(owner)
                    return
                except Exception:  # the store still away: the quota waits, the service does not
                    delay = min(delay * 2, _TRIM_BACKOFF_S[1])
        finally:
            self._trimming.discard(owner)

    async def get(self, owner: str, response_id: str) -> dict[str, Any]:
        return (await self._stored(owner, response_id)).response

    async def input_items(self, owner: str, response_id: str) -> list[dict[str, Any]]:
        return (await self._stored(owner, response_id)).input

    async def tasks_of(self, owner: str, response_id: str) -> list[str]:
        """The ids of the task records that carry a response (their events go before them)."""
        return await self.store.response_tasks(owner, response_id)

    async def delete(self, owner: str, response_id: str) -> None:
        """Forgets it, with its task records and the idempotency answers that hold it, in one
        store transaction (issue 38: a failure leaves every copy, readable and deletable
        again; success leaves none); 404 when no copy was there."""
        try:
            found = await self.store.delete_response(owner, response_id)
        except ProblemError:  # the store away (503): the client retries after Retry-After
            raise
        except Exception:  # the store refused: nothing was deleted, and a retry may finish it
            log.exception("could not delete stored response %s", response_id)
            raise ProblemError(
                "storage_failed", "the response could not be deleted; nothing was, and a retry deletes it"
            ) from None
        if not found:
            raise ProblemError("response_not_found", f"no stored response {response_id!r}")

    async def _stored(self, owner: str, response_id: str) -> StoredResponse:
        stored = await self.store.get_response(owner, response_id)
        if stored is None:
            raise ProblemError("response_not_found", f"no stored response {response_id!r}")
        return stored
