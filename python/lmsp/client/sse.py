"""Reading an SSE body into events with the Rust WHATWG parser (`lmsp._core.SseParser`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from lmsp._core import SseEvent, SseParser

__all__ = ["iter_events"]


def iter_events(chunks: Iterable[bytes]) -> Iterator[SseEvent]:
    """Events as they complete, from any iterable of body chunks (e.g. httpx's iter_bytes)."""
    parser = SseParser()
    for chunk in chunks:
        yield from parser.feed(chunk)
