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

    def start(self) -> None:
        """On the serving loop: the retention sweep, at once and then every `sweep_interval`."""
        if self.retention > 0 and self._sweeper is None:
            self._sweeper = asyncio.ensure_future(self._sweep_forever())

    def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    async def sweep(self) -> int:
        """Forgets every stored response older than the retention; returns how many."""
        return await self.store.expire_responses(int(time.time() - self.retention))

    async def _sweep_forever(self) -> None:
        while True:
            try:
                if gone := await self.sweep():
                    log.info("retention: forgot %d stored responses older than %d s", gone, int(self.retention))
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
        if self.quota > 0:
            # Past the quota the owner's oldest go, not this one: a client that stores every
            # call keeps working, and its latest conversations stay continuable.
            await self.store.trim_responses(owner, self.quota)
        if self.quota_bytes > 0:
            # The same for bytes; this one stays even when it alone is past the bound.
            await self.store.trim_response_bytes(owner, self.quota_bytes)

    async def get(self, owner: str, response_id: str) -> dict[str, Any]:
        return (await self._stored(owner, response_id)).response

    async def input_items(self, owner: str, response_id: str) -> list[dict[str, Any]]:
        return (await self._stored(owner, response_id)).input

    async def delete(self, owner: str, response_id: str) -> list[str]:
        """Forgets it, with its task records and the idempotency answers that hold it (issue
        28: a deleted response is readable nowhere); returns those tasks' ids."""
        if not await self.store.delete_response(owner, response_id):
            raise ProblemError("response_not_found", f"no stored response {response_id!r}")
        return await self.store.forget_traces(owner, response_id)

    async def _stored(self, owner: str, response_id: str) -> StoredResponse:
        stored = await self.store.get_response(owner, response_id)
        if stored is None:
            raise ProblemError("response_not_found", f"no stored response {response_id!r}")
        return stored
