"""When to try a request again, and how long to wait first. Pure: the sync and the async
client both ask these questions and only differ in how they sleep."""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass

import httpx

__all__ = ["RETRY_STATUSES", "Retry", "Attempts", "retry_after_seconds"]

# 409: the first request with this key still runs; 429: a full queue or too many streams;
# 503: the model is (re)loading or the service is stopping. All are safe to repeat with the
# same Idempotency-Key: the service answers a key at most once.
RETRY_STATUSES = frozenset({409, 429, 503})


@dataclass(frozen=True)
class Retry:
    """`attempts` tries after the first, `backoff` seconds before the first of them, doubling up
    to `max_backoff`; a Retry-After from the service is waited instead (up to `max_wait`)."""

    attempts: int = 8
    backoff: float = 0.2
    max_backoff: float = 5.0
    max_wait: float = 60.0

    def delay(self, failures: int) -> float:
        return float(min(self.backoff * 2 ** (failures - 1), self.max_backoff))


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Retry-After as seconds: delta-seconds or an HTTP-date (RFC 9110 §10.2.3)."""
    if value is None:
        return None
    value = value.strip()
    if value.isascii() and value.isdigit():  # `²`.isdigit() too, and float() refuses it
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


class Attempts:
    """The retry state of one call: each failure asks `next_delay`, None meaning give up."""

    def __init__(self, policy: Retry) -> None:
        self.policy = policy
        self.failures = 0

    def after_status(self, status: int, retry_after: float | None) -> float | None:
        if status not in RETRY_STATUSES:
            return None
        return self._next(retry_after)

    def after_transport_error(self, error: httpx.TransportError) -> float | None:
        # A request that may not have reached the service (or whose answer was lost) is
        # repeated; a malformed URL or an unsupported protocol never gets better.
        if isinstance(error, httpx.UnsupportedProtocol):
            return None
        return self._next(None)

    def after_drop(self) -> float | None:
        """A stream the service closed before its end (it is stopping, or a proxy cut it)."""
        return self._next(None)

    def progressed(self) -> None:
        """The service answered something useful: later failures start the count afresh."""
        self.failures = 0

    def _next(self, retry_after: float | None) -> float | None:
        self.failures += 1
        if self.failures > self.policy.attempts:
            return None
        if retry_after is not None:
            return min(retry_after, self.policy.max_wait)
        return self.policy.delay(self.failures)
