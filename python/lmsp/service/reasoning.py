"""Splits a thinking model's output, as it streams, into its thinking and its answer.

The frame comes from the template (engine/thinking.py): what opens the block (or the prompt
opened it already), what closes it, and what stands between it and the answer. The markup
never reaches either side: text that might be the start of the opener or the closer is held
back until it is known not to be, and the newlines around the thinking (the model writes
`<think>\\n…\\n</think>\\n\\n`) are dropped, as templates strip them when they render it
back; the deltas add up to the item's text exactly.
"""

from __future__ import annotations

from typing import Protocol

from ..engine.sequence import FinishReason
from ..engine.thinking import ThinkFormat
from .builder import EventBuilder

__all__ = ["ReasoningEvents", "ThinkSplitter", "ThinkingSink"]


class ReasoningEvents(Protocol):
    def reasoning_started(self) -> None: ...

    def reasoning(self, delta: str) -> None: ...

    def reasoning_done(self) -> None: ...

    def answer(self, text: str) -> None: ...


def _held_back(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could begin `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ThinkSplitter:
    """`opened`: the prompt ends inside the block, so the output starts with thinking."""

    def __init__(self, events: ReasoningEvents, fmt: ThinkFormat, *, opened: bool) -> None:
        self._events = events
        self._fmt = fmt
        self._pending = ""
        # start → thinking → after → answer; `start` decides whether there is thinking at all.
        self._state = "start"
        self._leading = True  # the thinking's first text: its leading whitespace is dropped
        if opened:
            self._open()

    @property
    def thinking(self) -> bool:
        """Still before the answer (its tokens count as reasoning tokens)."""
        return self._state != "answer"

    def _open(self) -> None:
        self._state = "thinking"
        self._events.reasoning_started()

    def feed(self, piece: str) -> None:
        if self._state == "answer":
            self._events.answer(piece)
            return
        self._pending += piece
        while self._step():
            pass

    def flush(self) -> None:
        """At the end of the output: a block still open is closed as it stands; text held
        back was text after all."""
        pending, self._pending = self._pending, ""
        if self._state == "thinking":
            if pending.strip("\n"):
                self._events.reasoning(pending.rstrip("\n"))
            self._events.reasoning_done()
        elif self._state == "start" and pending:
            self._events.answer(pending)
        self._state = "answer"

    def _step(self) -> bool:
        pending = self._pending
        if self._state == "start":
            return self._start(pending)
        if self._state == "thinking":
            return self._thinking(pending)
        # after: the answer's head (harmony's final channel), then whitespace, then the answer
        head = self._fmt.answer_head
        if head:
            if len(pending) < len(head) and head.startswith(pending):
                return False
            if pending.startswith(head):
                pending = pending[len(head) :]
        stripped = pending.lstrip()
        self._pending = stripped
        if not stripped:
            self._pending = ""
            return False
        self._state = "answer"
        self._pending = ""
        self._events.answer(stripped)
        return False

    def _start(self, pending: str) -> bool:
        text = pending.lstrip()
        for head in (self._fmt.opener, *self._fmt.direct_heads):
            if text.startswith(head):
                self._pending = text[len(head) :]
                if head == self._fmt.opener:
                    self._open()
                else:
                    self._state = "after"
                return True
            if head.startswith(text):
                return False  # it may still become this head
        self._state = "answer"
        self._pending = ""
        self._events.answer(pending)
        return False

    def _thinking(self, pending: str) -> bool:
        if self._leading:
            pending = pending.lstrip("\n")
            self._pending = pending
            if not pending:
                return False
            self._leading = False
        closer = self._fmt.closer
        at = pending.find(closer)
        if at >= 0:
            text = pending[:at].rstrip("\n")
            if text:
                self._events.reasoning(text)
            self._events.reasoning_done()
            self._pending = pending[at + len(closer) :]
            self._state = "after"
            return True
        # Hold back what may begin the closer, and trailing newlines (they may end the block).
        keep = _held_back(pending, closer)
        body = pending[: len(pending) - keep]
        emit = body.rstrip("\n")
        if emit:
            self._events.reasoning(emit)
        self._pending = body[len(emit) :] + pending[len(pending) - keep :]
        return False


class ThinkingSink:
    """The sink of a thinking model's generation: the thinking goes to the builder's
    reasoning item, the answer to the builder as any output (text, or calls)."""

    def __init__(self, builder: EventBuilder, fmt: ThinkFormat, *, opened: bool) -> None:
        self.builder = builder
        self.splitter = ThinkSplitter(_Events(self), fmt, opened=opened)
        self._stop: bool | None = None

    def on_text(self, text: str) -> bool | None:
        if not self.splitter.thinking:
            return self.builder.on_text(text)
        # Counted as a thinking token: the token that closes the block too.
        self.builder.reasoning_tokens += 1
        self._stop = None
        self.splitter.feed(text)
        return self._stop

    def answer_text(self, text: str) -> None:
        self._stop = self.builder.on_text(text) or self._stop

    def on_finish(self, reason: FinishReason, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> None:
        self.splitter.flush()
        self.builder.on_finish(reason, input_tokens, output_tokens, cached_tokens)

    def on_error(self, message: str) -> None:
        self.splitter.flush()
        self.builder.on_error(message)


class _Events:
    """The splitter's events: reasoning to the builder, the answer through the sink."""

    def __init__(self, sink: ThinkingSink) -> None:
        self._sink = sink

    def reasoning_started(self) -> None:
        self._sink.builder.reasoning_started()

    def reasoning(self, delta: str) -> None:
        self._sink.builder.reasoning(delta)

    def reasoning_done(self) -> None:
        self._sink.builder.reasoning_done()

    def answer(self, text: str) -> None:
        self._sink.answer_text(text)
