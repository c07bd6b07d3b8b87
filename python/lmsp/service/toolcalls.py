"""Splits a tool-enabled response's output, as it streams, into message text and calls.

The grammar (engine/tools.py) fixes the frame of every call, so this is a small state
machine, not a parser that guesses: text until `<tool_call>`, then the call's head up to
its arguments, then the arguments until the frame's end. Text that might be the start of a
call is held back until it is known not to be, so nothing of a call reaches the text.
"""

from __future__ import annotations

import re
from typing import Protocol

import orjson

from ..engine.tools import CALL_END, CALL_START

__all__ = ["CallEvents", "CallSplitter"]

_HEAD = re.compile(r'\{"name": ("(?:[^"\\]|\\.)*"), "arguments": ')
_MARK = CALL_START.rstrip("\n")


class CallEvents(Protocol):
    def text(self, delta: str) -> None: ...

    def call_started(self, name: str) -> None: ...

    def arguments(self, delta: str) -> None: ...

    def call_done(self, arguments: str) -> None: ...


def _held_back(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could begin `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class CallSplitter:
    def __init__(self, events: CallEvents) -> None:
        self._events = events
        self._state = "text"  # text → head → arguments → between → head …
        self._pending = ""
        self._arguments: list[str] = []

    def feed(self, piece: str) -> None:
        self._pending += piece
        while self._step():
            pass

    def flush(self) -> None:
        """At the end of the output: text held back was text after all; an unfinished call
        (the output was cut short) is dropped, its arguments being no valid JSON."""
        if self._state == "text" and self._pending:
            self._events.text(self._pending)
        self._pending = ""

    def _step(self) -> bool:
        pending = self._pending
        if self._state == "text":
            at = pending.find(_MARK)
            if at < 0:
                keep = _held_back(pending, _MARK)
                if len(pending) > keep:
                    self._events.text(pending[: len(pending) - keep])
                    self._pending = pending[len(pending) - keep :]
                return False
            if at:
                self._events.text(pending[:at])
            self._pending = pending[at + len(_MARK) :]
            self._state = "head"
            return True
        if self._state == "head":
            match = _HEAD.search(pending)
            if match is None:
                return False
            self._events.call_started(orjson.loads(match.group(1)))
            self._pending = pending[match.end() :]
            self._arguments = []
            self._state = "arguments"
            return True
        if self._state == "arguments":
            at = pending.find(CALL_END)
            if at < 0:
                keep = _held_back(pending, CALL_END)
                if len(pending) > keep:
                    delta = pending[: len(pending) - keep]
                    self._arguments.append(delta)
                    self._events.arguments(delta)
                    self._pending = pending[len(pending) - keep :]
                return False
            # The frame's `}` closes the call's object: the arguments end just before it.
            delta = pending[:at]
            self._arguments.append(delta)
            self._events.arguments(delta)
            self._events.call_done("".join(self._arguments))
            self._pending = pending[at + len(CALL_END) :]
            self._state = "between"
            return True
        # between calls: the grammar allows only "\n<tool_call>" or the end
        at = pending.find(_MARK)
        if at < 0:
            return False
        self._pending = pending[at + len(_MARK) :]
        self._state = "head"
        return True
