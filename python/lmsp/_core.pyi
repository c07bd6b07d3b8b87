"""Type stubs for `lmsp._core`, the Rust extension (crates/lmsp-python)."""

from collections.abc import Callable, Sequence
from typing import final

__all__ = [
    "CompiledGrammar",
    "Constraint",
    "EventHistoryExpired",
    "EventLog",
    "EventLogClosed",
    "GrammarError",
    "GrammarProbe",
    "InvalidEvent",
    "InvalidEventName",
    "InvalidLimit",
    "InvalidUtf8",
    "LmspCoreError",
    "SseEvent",
    "SseParser",
    "Vocabulary",
    "encode_comment",
    "encode_frame",
    "narrowed_json_schema",
    "prepared_json_schema",
]

class LmspCoreError(Exception):
    """Base class of every error raised by lmsp._core."""

class EventLogClosed(LmspCoreError):
    """The EventLog is closed: its response is over and takes no more events."""

class EventHistoryExpired(LmspCoreError):
    """Some of the events asked for are no longer kept (410 event_history_expired).

    The ring dropped them to stay within its bounds, or the history expired after the log
    closed. Resuming is possible only after `first_id - 1` or later.
    """

    after: int
    """The id asked to read after."""
    first_id: int
    """The oldest id still kept; `last_id + 1` when none is."""

class InvalidLimit(LmspCoreError, ValueError):
    """An EventLog limit out of range, e.g. max_events=0 or a negative expire_after."""

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
    """A bounded ring of SSE-framed events for one response; ids start at 1 and grow by 1.

    The oldest events are dropped once `max_events` events or `max_bytes` bytes of wire
    frames are kept (the newest event is always kept, even alone over `max_bytes`), and the
    whole history is dropped once the log has been closed for `expire_after` seconds and
    `expire_if_due` (or `expire`) is called. Reading events that were dropped raises
    EventHistoryExpired. Memory grows with what is appended, up to the bounds.

    Times (`now`, `expires_at`) are on the `time.monotonic()` clock, which asyncio's loop
    uses by default; pass `now` explicitly to make tests exact.

    Thread-safe: a producer thread appends while asyncio readers read and wait.
    """

    def __init__(self, *, max_events: int = 65536, max_bytes: int = 16777216, expire_after: float = 300.0) -> None:
        """Raises InvalidLimit for max_events or max_bytes of 0 or a negative expire_after."""
    def append(self, event: str, data: bytes) -> int:
        """Appends an event whose data is JSON text; returns its id.

        Raises EventLogClosed, InvalidEventName or InvalidUtf8.
        """
    def append_text(self, event: str, head: bytes, text: str, tail: bytes) -> int:
        """Appends an event whose data is `head + json_string(text) + tail`; returns its id.

        With a mirror set (`mirror_text`), also appends the text to the mirror, numbered.
        """
    def append_numbered(self, event: str, head: bytes, tail: bytes, text: str | None = None) -> int:
        """Appends an event whose data is `head + json_string(text) + tail + str(id) + "}"`
        (no text: `head + tail + str(id) + "}"`), `id` being the id it gets; returns it."""
    def mirror_text(self, log: EventLog | None, event: str = "", head: bytes = b"", tail: bytes = b"") -> None:
        """From now on each `append_text` also appends its text to `log`, as
        `log.append_numbered(event, head, tail, text)` would, skipped once `log` is closed;
        None stops it."""
    def close(self, now: float | None = None) -> None:
        """Closes the log at `now` (default: time.monotonic()) and wakes waiting readers.

        Starts the `expire_after` clock. Idempotent: the first close's time stands.
        """
    def expire(self) -> None:
        """Drops the whole history now and frees its memory; keeps last_id and closed.

        Meant for closed logs (e.g. from a timer set for `expires_at`). On an open log,
        waiting readers are woken and later appends are kept as usual.
        """
    def expire_if_due(self, now: float | None = None) -> bool:
        """Expires the history if the log closed at least `expire_after` seconds before
        `now` (default: time.monotonic()); returns whether it is expired."""
    @property
    def closed(self) -> bool: ...
    @property
    def expired(self) -> bool:
        """Whether expire() or a due expire_if_due() dropped the history."""
    @property
    def expires_at(self) -> float | None:
        """When the history is due to expire (close time + expire_after); None while open."""
    @property
    def last_id(self) -> int:
        """The newest id; 0 while nothing was appended. Kept after expiry."""
    @property
    def first_id(self) -> int:
        """The oldest id still kept; `last_id + 1` when none is. Reading after any id from
        `first_id - 1` on succeeds."""
    @property
    def retained_bytes(self) -> int:
        """The wire bytes of the kept frames, which `max_bytes` bounds."""
    @property
    def max_events(self) -> int: ...
    @property
    def max_bytes(self) -> int: ...
    @property
    def expire_after(self) -> float:
        """Seconds the history outlives the close."""
    def frames_after(self, after: int, limit: int | None = None) -> tuple[int, bytes]:
        """(last id, the wire frames of every event with id > after, concatenated).

        With `limit`, only the frames that fit in `limit` bytes, cut between frames (the
        first one whole even when it alone is larger), and the id of the last of them.
        Raises EventHistoryExpired if some of those events are no longer kept.
        `after >= last_id` gives `(last_id, b"")`, even after expiry: nothing was missed.
        """
    def entries_after(self, after: int) -> list[tuple[int, str, bytes]]:
        """(id, event, data) of every event with id > after.

        Raises EventHistoryExpired if some of those events are no longer kept.
        """
    def wait(self, after: int, waker: Callable[[], object]) -> bool:
        """Registers `waker` for the next append, close or expire, unless there is no need to wait.

        False: events after `after` exist (kept, or dropped: read now to get
        EventHistoryExpired) or the log is closed; nothing registered, read now.
        True: `waker` will be called exactly once, with the GIL, on the thread that does the
        next append, close or expire, after the log's lock is released. Its exceptions are
        reported as unraisable and never reach the appender.
        """

def prepared_json_schema(schema: str) -> str:
    """A JSON schema (JSON text) as the engine compiles it (the service's JSON layout), for a
    Lark grammar's `%json`. GrammarError if it is not JSON."""

def narrowed_json_schema(schema: str) -> str:
    """A JSON schema (JSON text) narrowed as the service narrows a client's, on the schema as
    given: declared keys only, integers in the 64-bit range, real dates (lmsp_constrain's
    `narrow`). GrammarError if it is not JSON."""

def _greedy_at(logits: int, n_vocab: int) -> int:
    """The likeliest token of the `n_vocab` floats at address `logits` (lowest id on a tie):
    for the scheduler alone, on a logits row it just decoded."""

class GrammarError(LmspCoreError):
    """A grammar or JSON schema the constraint engine cannot enforce, or one over its limits;
    the message names the keyword or the limit."""

@final
class Vocabulary:
    """A model's vocabulary for constrained sampling; compiles grammars and caches them
    (bounded, in memory) by their text. Thread-safe."""

    def __init__(self, tokens: Sequence[bytes | str], end: Sequence[int], *, fast_forward: bool = False) -> None:
        """`tokens[i]` is token i: the bytes it adds to the output, or (`str`) the name of a
        control token. `end`: the end-of-generation token ids. `fast_forward`: generations
        may commit forced text in runs (`Constraint._fast_forward`). ValueError if unusable."""
    @property
    def n_vocab(self) -> int: ...
    @property
    def cached_grammars(self) -> int: ...
    def compile_json_schema(self, schema: str) -> CompiledGrammar:
        """Compiles a JSON schema (JSON text). Raises GrammarError naming what cannot be
        enforced. Releases the GIL (milliseconds)."""
    def compile_lark(self, grammar: str) -> CompiledGrammar:
        """Compiles a grammar in llguidance's Lark dialect (it may embed `%json {…}`)."""

@final
class CompiledGrammar:
    """A grammar compiled for one vocabulary, at its start state."""

    def start(
        self,
        *,
        temperature: float,
        seed: int,
        min_p: float,
        top_k: int = 0,
        top_p: float = 1.0,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        penalty_last_n: int = 64,
        mask_every_token: bool = False,
    ) -> Constraint:
        """A generation under this grammar, sampled as llama.cpp's chain samples among the
        tokens it allows: repetition penalties over the last `penalty_last_n` tokens of its
        own output, then `top_k` (0: off), `top_p` (1: off), `min_p` (0: off), `temperature`
        (0: greedy), and a draw that `seed` fixes. Each step samples from the whole row and
        checks that one token; `mask_every_token` computes the full mask at every step instead
        (the same outputs, slower: the reference for tests). Top-k and top-p always mask."""
    def _probe(self) -> GrammarProbe:
        """A reader of texts under this grammar, from its start: for conformance runs."""

@final
class GrammarProbe:
    """Whether a text is (a prefix of) a sentence of a grammar, read as the model would write it."""

    def feed(self, text: bytes) -> bool:
        """Reads `text`; False (and the probe is spent) when the grammar refuses it."""
    def accepting(self) -> bool:
        """Whether what was read so far is a whole sentence."""
    def fork(self) -> GrammarProbe:
        """An independent copy, at the same point."""

@final
class Constraint:
    """One generation's grammar state and sampler, stepped by one thread."""

    def _step_at(self, logits: int, n_vocab: int) -> tuple[int, bool]:
        """The scheduler's, not public: chooses and commits one token from the
        `n_vocab` floats at address `logits`, llama.cpp's live logits row (never copied;
        written only to apply repetition penalties, when they are set). ValueError if
        `n_vocab` is not the grammar's vocabulary size. Returns `(token, done)`: token -1
        means nothing to emit; `done` means the output ends now. After an error, `error`
        says why."""
    def _fast_forward(self, max: int) -> tuple[list[int], bool]:
        """The scheduler's, not public: after a step that returned a token, the tokens the
        grammar forces next (at most `max`), committed as if sampled, and whether the output
        ends with them. `([], False)` when nothing is forced or the vocabulary was built
        without `fast_forward`."""
    @property
    def stats(self) -> dict[str, int]:
        """Summed over the steps so far: `steps`, `masks` (steps that computed the full
        mask), `forced` (tokens fast-forwarded), and nanoseconds in `sample_ns`, `check_ns`,
        `mask_ns`, `commit_ns`, `forward_ns`."""
    @property
    def error(self) -> str | None: ...
