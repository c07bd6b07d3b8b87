"""Reading an SSE body into events with the Rust WHATWG parser (`lmsp._core.SseParser`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from lmsp._core import SseEvent, SseParser

from .errors import APIConnectionError

__all__ = ["MAX_EVENT_BYTES", "BoundedParser", "EventTooLarge", "iter_events"]

# The most a stream may send without completing an event or a comment: the service's own
# events are far smaller (its ring keeps 16 MiB in all), so past this the peer is not one.
MAX_EVENT_BYTES = 16 * 1024 * 1024


class EventTooLarge(APIConnectionError):
    """The stream sent more than `max_bytes` without completing an event: it is cut."""


class BoundedParser:
    """`SseParser` that holds at most about `max_bytes` of an unfinished event (counted in
    whole chunks since the last event or comment), and keeps no comments: a keep-alive every
    15 s for a day would otherwise pile up in `take_comments`."""

    def __init__(self, max_bytes: int = MAX_EVENT_BYTES) -> None:
        self._parser = SseParser()
        self._max = max_bytes
        self._pending = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        events = self._parser.feed(chunk)
        if events or self._parser.take_comments():
            self._pending = 0
        else:
            self._pending += len(chunk)
            if self._pending > self._max:
                raise EventTooLarge(f"the stream sent {self._pending} bytes without ending an event")
        return events


def iter_events(chunks: Iterable[bytes], max_bytes: int = MAX_EVENT_BYTES) -> Iterator[SseEvent]:
    """Events as they complete, from any iterable of body chunks (e.g. httpx's iter_bytes)."""
    parser = BoundedParser(max_bytes)
    for chunk in chunks:
        yield from parser.feed(chunk)
