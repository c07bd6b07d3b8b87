"""Idempotent replays (§9, profile): a retried POST gets the first answer again, not a second run.

A record is claimed before the request runs and finished with what was sent (status,
headers, body; for a stream, its event frames). Only a request that got as far as running
leaves a result: one refused before that (bad model, full queue) frees its key, and so does
one whose client vanished before the result reached it, so that the retry can run.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any

import orjson

from ..protocol.errors import ProblemError
from ..store import IdempotencyRecord, StoreWorker

__all__ = ["DEFAULT_MAX_REPLAY_BODY", "DEFAULT_TTL", "Replays", "fingerprint"]

DEFAULT_TTL = 24 * 3600.0
HEADER = "Idempotency-Key"
# The most of an answer a record keeps for its replay (--idempotency-max-body): a client that
# sends a new key with every long stream must not fill the store for DEFAULT_TTL (issue 28).
DEFAULT_MAX_REPLAY_BODY = 1024 * 1024
# Kept in place of a body past the bound: its size. A retry then gets a 409, not a second run.
_DROPPED = "lmsp-replay-dropped"


def fingerprint(target: str, body: Any) -> bytes:
    """Same request = same target and same JSON (key order and spacing do not matter)."""
    return hashlib.sha256(target.encode() + b"\n" + orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).digest()


class Replays:
    def __init__(
        self,
        store: StoreWorker,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.time,
        max_body: int = DEFAULT_MAX_REPLAY_BODY,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.clock = clock
        self.max_body = max_body

    async def begin(self, owner: str, key: str, print_: bytes) -> IdempotencyRecord | None:
        """None: the key is now this request's, run it. A record: replay it."""
        record = await self.store.claim_key(owner, key, print_, self.clock(), self.ttl)
        if record is None:
            return None
        if record.fingerprint != print_:
            raise ProblemError(
                "idempotency_key_reused",
                "this Idempotency-Key was used with a different request body; use a new key",
                param=HEADER,
            )
        if record.running:
            raise ProblemError(
                "idempotency_conflict",
                "the first request with this Idempotency-Key is still running; retry when it is done",
                param=HEADER,
                headers=[("retry-after", "1")],
            )
        if any(name == _DROPPED for name, _ in record.headers):
            raise ProblemError(
                "idempotency_conflict",
                f"the first request with this Idempotency-Key succeeded, but its answer was larger than "
                f"{self.max_body} bytes and is not kept for a replay; read the result by its id, or use a new key",
                param=HEADER,
            )
        return record

    async def finish(self, owner: str, key: str, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        if len(body) > self.max_body:
            # The key stays taken (the request did run), but only its size is kept.
            headers, body = [(_DROPPED, str(len(body)))], b""
        await self.store.finish_key(owner, key, status, headers, body)

    async def release(self, owner: str, key: str) -> None:
        await self.store.release_key(owner, key)
