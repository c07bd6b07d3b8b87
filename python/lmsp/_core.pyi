"""Type stubs for `lmsp._core`, the Rust extension (crates/lmsp-python)."""

from collections.abc import Callable
from typing import final

__all__ = [
    "EventLog",
    "EventLogClosed",
    "InvalidEvent",
    "InvalidEventName",
    "InvalidUtf8",
    "LmspCoreError",
    "SseEvent",
    "SseParser",
    "encode_comment",
    "encode_frame",
]

class LmspCoreError(Exception):
    """Base class of every error raised by lmsp._core."""

class EventLogClosed(LmspCoreError):
    """The EventLog is closed: its response is over and takes no more events."""

class InvalidEvent(LmspCoreError, ValueError):
    """An event that cannot be encoded or logged."""

class InvalidEventName(InvalidEvent):
    """An SSE event name that is empty or holds CR or LF."""

class InvalidUtf8(InvalidEvent):
    """Event data that is not valid UTF-8."""

def encode_frame(id: int | None, event: str | None, data: str | bytes) -> bytes:
    """One SSE frame: `id: N`, `event: NAME`, one `data:` line per line of `data`, a blank line.

    Raises InvalidEventName for an empty name or one holding CR/LF, InvalidUtf8 for
    bytes data that is not UTF-8, TypeError for data that is neither str nor bytes.
    """

def encode_comment(text: str) -> bytes:
    """A comment frame, `: text` (one `:` line per line of text), e.g. a keep-alive."""

@final
class SseEvent:
    """One event parsed from an SSE stream. Frozen, comparable and hashable."""

    @property
    def id(self) -> str | None:
        """The last event id at dispatch (it persists across events); None if never set."""
    @property
    def event(self) -> str:
        """The event type; "message" when the frame named none."""
    @property
    def data(self) -> str:
        """The data lines joined with "\\n"."""
    @property
    def retry(self) -> int | None:
        """The reconnection time in ms, if the stream ever set one."""
    def __new__(
        cls, *, data: str, event: str = "message", id: str | None = None, retry: int | None = None
    ) -> SseEvent: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class SseParser:
    """An incremental WHATWG event-stream parser; feed it chunks split anywhere."""

    def __init__(self) -> None: ...
    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events this chunk completed. Comments are kept for take_comments()."""
    def take_comments(self) -> list[str]:
        """The comments seen so far (text after ":", one leading space dropped); drains them."""

@final
class EventLog:
    """An append-only log of SSE-framed events for one response; ids start at 1.

    Thread-safe: a producer thread appends while asyncio readers read and wait.
    """

    def __init__(self) -> None: ...
    def append(self, event: str, data: bytes) -> int:
        """Appends an event whose data is JSON text; returns its id.

        Raises EventLogClosed, InvalidEventName or InvalidUtf8.
        """
    def append_text(self, event: str, head: bytes, text: str, tail: bytes) -> int:
        """Appends an event whose data is `head + json_string(text) + tail`; returns its id."""
    def close(self) -> None:
        """Closes the log and wakes waiting readers. Idempotent."""
    @property
    def closed(self) -> bool: ...
    @property
    def last_id(self) -> int:
        """The newest id; 0 while empty."""
    def frames_after(self, after: int) -> tuple[int, bytes]:
        """(last id, the wire frames of every event with id > after, concatenated)."""
    def entries_after(self, after: int) -> list[tuple[int, str, bytes]]:
        """(id, event, data) of every event with id > after."""
    def wait(self, after: int, waker: Callable[[], None]) -> bool:
        """Registers `waker` for the next append or close, unless there is no need to wait.

        False: events after `after` exist or the log is closed; nothing registered, read now.
        True: `waker` will be called exactly once, with the GIL, on the thread that does the
        next append or close, after the log's lock is released. Its exceptions are reported
        as unraisable and never reach the appender.
        """
