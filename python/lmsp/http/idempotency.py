"""The `Idempotency-Key` header (§9, profile): parsing it, and answering a POST at most once
per key (a retry with the same key and body gets the recorded answer again)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from lmsp._core import EventLog

from ..protocol import events as ev
from ..protocol.errors import ProblemError
from ..protocol.openapi import IDEMPOTENCY_KEY_PATTERN
from ..service.responses import ResponseRun
from ..store import IdempotencyRecord
from .replays import Replays, fingerprint
from .request import Request
from .wire import Sent, sse_headers

__all__ = ["answer_once", "idempotency_key", "replayable", "send_replay", "stream_sent"]

_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
HEADER = "Idempotency-Key"

# Answers the request; returns what it sent when that is worth replaying, None when a retry
# should run again instead (the client left, or the service went away).
Answer = Callable[[], Awaitable["Sent | None"]]


def idempotency_key(req: Request) -> str | None:
    """The key, unquoted (`"abc"` and `abc` are the same key); None when there is none."""
    values = req.header_values("idempotency-key")
    if not values:
        if "idempotency-key" in req.scope.headers:  # present, but granian could not decode it
            raise ProblemError("invalid_request", "Idempotency-Key must be printable ASCII", param=HEADER)
        return None
    if len(values) > 1:
        raise ProblemError("invalid_request", "send at most one Idempotency-Key header", param=HEADER)
    value = values[0]
    if not _KEY.match(value):
        raise ProblemError(
            "invalid_request",
            "Idempotency-Key must be 1-255 printable ASCII characters, bare or as a quoted string",
            param=HEADER,
        )
    return value[1:-1] if value.startswith('"') else value


async def answer_once(
    req: Request, idempotency: Replays | None, key: str | None, target: str, body: Any, answer: Answer
) -> None:
    """Runs `answer` unless this key already has an answer for this `target` and body (replayed),
    another body or target (422), or a first request still running (409). The target is part
    of the fingerprint: a key first used to create a response is not a task's key."""
    if key is None or idempotency is None:
        await answer()
        return
    record = await idempotency.begin(req.owner, key, fingerprint(target, body))
    if record is not None:
        send_replay(req.proto, record)
        return
    sent: Sent | None = None
    try:
        sent = await answer()
    finally:
        if sent is None:
            await idempotency.release(req.owner, key)
        else:
            await idempotency.finish(req.owner, key, *sent)


def send_replay(proto: Any, record: IdempotencyRecord) -> None:
    assert record.status is not None
    proto.response_bytes(record.status, [*record.headers, ("idempotent-replayed", "true")], record.body)


def replayable(run: ResponseRun) -> bool:
    """A result a retry should get again: not one cut short by the client leaving
    (cancelled) or by the service going away (an `error` event)."""
    [(_, final, _)] = run.log.entries_after(run.log.last_id - 1)
    return final not in (ev.CANCELLED, ev.ERROR)


def stream_sent(delivered: bool, run: ResponseRun, log: EventLog) -> Sent | None:
    """What a retry of a stream gets again: the stream `log` sent, when it went out whole, was
    not cut short, and still has every frame in its ring (a longer one leaves the key free)."""
    if not delivered or not replayable(run) or log.first_id > 1:
        return None
    return 200, sse_headers(), log.frames_after(0)[1]
