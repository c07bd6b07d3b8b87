"""Whether this replica should be sent new work: what `GET /ready` answers a balancer or an
orchestrator (http/probes.py).

Not ready while the models it preloads load (the port opens before them: server.py), while it
drains (a SIGTERM came), or while the store or the task events cannot be reached. Those are
pinged in the background, each bounded by the wait a request for them already has (the store's
request deadline, Redis's socket timeout): a probe then reads the latest verdict at once, and a
stall shorter than those waits, which requests ride out, does not take the replica out of the
balancer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["CHECK_PERIOD_S", "DRAINING", "LOADING", "Readiness"]

log = logging.getLogger(__name__)

CHECK_PERIOD_S = 2.0
DRAINING = "draining"
LOADING = "loading"

Check = tuple[str, Callable[[], Awaitable[None]]]


class Readiness:
    """`checks`: (the reason it gives when it fails, the ping), e.g. ("store_unreachable",
    store.ping)."""

    def __init__(self, checks: Sequence[Check] = (), period: float = CHECK_PERIOD_S) -> None:
        self.checks = list(checks)
        self.period = period
        self.draining = False
        self.loading = False
        self._failing: set[str] = set()
        self._loop: asyncio.Task[None] | None = None

    def reasons(self) -> list[str]:
        """Why it is not ready; empty when it is."""
        flags = [reason for reason, on in ((DRAINING, self.draining), (LOADING, self.loading)) if on]
        return [*flags, *sorted(self._failing)]

    def start(self) -> None:
        """On the serving loop: a round now, then every `period` seconds."""
        self._loop = asyncio.ensure_future(self._check_forever())

    async def aclose(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)

    async def check(self) -> None:
        """One round: every ping at once, each as long as its own bound lets it."""
        results = await asyncio.gather(*(ping() for _, ping in self.checks), return_exceptions=True)
        for (reason, _), result in zip(self.checks, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                if reason not in self._failing:
                    log.warning("not ready: %s (%s)", reason, result or type(result).__name__)
                self._failing.add(reason)
            elif reason in self._failing:
                log.warning("ready again: %s no more", reason)
                self._failing.discard(reason)

    async def _check_forever(self) -> None:
        while True:
            await self.check()
            await asyncio.sleep(self.period)
