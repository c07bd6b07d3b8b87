"""Splits a tool-enabled response's output, as it streams, into message text and calls.

The grammar (engine/tools.py) fixes the frame of every call, so this is a small state
machine, not a parser that guesses: text until what opens the calls, then a call's head up
to its arguments, the arguments until their JSON value ends, the frame's closer, then the
next call's head or the end. Text that might be the start of a call is held back until it is
known not to be, so nothing of a call reaches the text.

A custom tool's call (Hermes frames) has its head on a line of its own, then raw input in
the tool's grammar up to `CUSTOM_CLOSER`. The input ends at the first closer that the end of
the output or the next call's opener follows; until that is known, the closer is held back.
"""

from __future__ import annotations

import re
from typing import Protocol

import orjson

from ..engine.tools import CUSTOM_CLOSER, CallFormat

__all__ = ["CallEvents", "CallSplitter", "RepeatGuard"]

_NAME = r'\{"name": ("(?:[^"\\]|\\.)*")'


class CallEvents(Protocol):
    def text(self, delta: str) -> None: ...

    def call_started(self, name: str) -> None: ...

    def custom_call_started(self, name: str) -> None:
        """A custom tool's call: its `arguments` deltas are its raw input."""
        ...

    def arguments(self, delta: str) -> None: ...

    def call_done(self, arguments: str, *, complete: bool = True) -> None: ...


def _held_back(text: str, marker: str) -> int:
    """Length of the longest end of `text` that could begin `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class _JsonEnd:
    """Finds where one JSON value ends in text fed piece by piece (the grammar made it valid,
    so only strings and nesting need tracking)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escape = False
        self.scalar = False  # a bare number or literal, ended by the first character after it

    def scan(self, text: str) -> int:
        """The index just past the value's end in `text`, or -1 if it goes on."""
        for i, c in enumerate(text):
            if self.in_string:
                if self.escape:
                    self.escape = False
                elif c == "\\":
                    self.escape = True
                elif c == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif self.scalar:
                if c not in "0123456789+-.eEtruefalsn":
                    return i
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            elif self.depth == 0 and not c.isspace():
                self.scalar = True
        return -1


class CallSplitter:
    def __init__(self, events: CallEvents, calls: CallFormat) -> None:
        self._events = events
        self._marker = calls.start.strip()
        # A function call's head ends where its arguments start; a custom call's at its newline.
        args = rf'(?:, "{re.escape(calls.args_key)}": |(\}}\n))'
        self._first = re.compile(re.escape(calls.start) + _NAME + args)
        self._next = re.compile(re.escape(calls.sep + calls.opener) + _NAME + args)
        self._next_opener = calls.sep + calls.opener
        self._closer = re.compile(calls.closer)
        # text → first head → arguments → closer → between → next head …; `plain`: text only.
        self._state = "text"
        self._pending = ""
        self._arguments: list[str] = []
        self._value = _JsonEnd()

    def feed(self, piece: str) -> None:
        self._pending += piece
        while self._step():
            pass

    def flush(self, *, cut: bool) -> None:
        """At the end of the output: text held back was text after all; a call whose
        arguments were cut short (`cut`: the output did not end on its own) ends incomplete,
        with the arguments it got."""
        if self._state == "text" and self._pending:
            self._events.text(self._pending)
        elif self._state == "arguments" and cut:
            self._events.call_done("".join(self._arguments), complete=False)
        elif self._state == "input":
            # Complete only when the output ended on its own right after the closer.
            whole = not cut and self._pending == CUSTOM_CLOSER
            self._events.call_done("".join(self._arguments) + ("" if whole else self._pending), complete=whole)
        self._pending = ""
        self._state = "plain"

    def _head(self, regex: re.Pattern[str]) -> bool:
        match = regex.match(self._pending)
        if match is None:
            return False
        custom = match.group(2) is not None
        started = self._events.custom_call_started if custom else self._events.call_started
        started(orjson.loads(match.group(1)))
        self._pending = self._pending[match.end() :]
        self._arguments = []
        self._value = _JsonEnd()
        self._state = "input" if custom else "arguments"
        return True

    def _input(self, delta: str) -> None:
        if delta:
            self._arguments.append(delta)
            self._events.arguments(delta)

    def _custom_input(self, pending: str) -> bool:
        at = pending.find(CUSTOM_CLOSER)
        if at < 0:
            keep = _held_back(pending, CUSTOM_CLOSER)
            self._input(pending[: len(pending) - keep])
            self._pending = pending[len(pending) - keep :]
            return False
        self._input(pending[:at])
        rest = pending[at + len(CUSTOM_CLOSER) :]
        self._pending = pending[at:]
        if len(rest) < len(self._next_opener) and self._next_opener.startswith(rest):
            return False  # the end of the output (flush) or the next call may still follow
        if rest.startswith(self._next_opener):
            self._events.call_done("".join(self._arguments))
            self._pending = rest
            self._state = "between"
            return True
        self._input(CUSTOM_CLOSER)  # the user's grammar had it inside the input
        self._pending = rest
        return True

    def _step(self) -> bool:
        pending = self._pending
        if not pending:
            return False
        state = self._state
        if state == "plain":
            self._events.text(pending)
            self._pending = ""
            return False
        if state == "text":
            if not self._marker:  # the calls are the whole output, or there are none
                self._state = "first" if pending[0] == "{" else "plain"
                return True
            at = pending.find(self._marker)
            if at < 0:
                keep = _held_back(pending, self._marker)
                if len(pending) > keep:
                    self._events.text(pending[: len(pending) - keep])
                    self._pending = pending[len(pending) - keep :]
                return False
            if at:
                self._events.text(pending[:at])
            self._pending = pending[at:]
            self._state = "first"
            return True
        if state == "first":
            return self._head(self._first)
        if state == "between":
            return self._head(self._next)
        if state == "input":
            return self._custom_input(pending)
        if state == "arguments":
            end = self._value.scan(pending)
            delta = pending if end < 0 else pending[:end]
            if delta:
                self._arguments.append(delta)
                self._events.arguments(delta)
            if end < 0:
                self._pending = ""
                return False
            self._events.call_done("".join(self._arguments))
            self._pending = pending[end:]
            self._state = "closer"
            return True
        # closer: the grammar wrote it whole before anything else can follow
        match = self._closer.match(pending)
        if match is None:
            return False
        self._pending = pending[match.end() :]
        self._state = "between"
        return True


class RepeatGuard:
    """Between the splitter and the builder: a call identical (name and arguments) to one
    already made in this response ends the calls instead of going out again. A small model
    under a forced choice otherwise repeats its call until the token budget runs out (four
    `{"city": "Tokyo"}` calls in 160 tokens), and a client runs the tool each time.

    A call that may still turn out a repeat (its name is taken and its arguments so far begin
    a taken call's) is held back; once it differs, what was held goes out and it streams on.
    `repeated` tells the sink to end the output."""

    def __init__(self, events: CallEvents) -> None:
        self._events = events
        self._made: list[tuple[str, str]] = []  # (name, arguments) of the calls made
        self._name = ""
        self._custom = False
        self._held: list[str] | None = None  # the held call's argument deltas, while held
        self.repeated = False

    def text(self, delta: str) -> None:
        if not self.repeated:
            self._events.text(delta)

    def call_started(self, name: str) -> None:
        self._start(name, custom=False)

    def custom_call_started(self, name: str) -> None:
        self._start(name, custom=True)

    def _start(self, name: str, *, custom: bool) -> None:
        if self.repeated:
            return
        self._name, self._custom = name, custom
        if any(made == name for made, _ in self._made):
            self._held = []
            return
        self._held = None
        self._open()

    def _open(self) -> None:
        (self._events.custom_call_started if self._custom else self._events.call_started)(self._name)

    def _release(self) -> None:
        held, self._held = self._held or [], None
        self._open()
        for delta in held:
            self._events.arguments(delta)

    def arguments(self, delta: str) -> None:
        if self.repeated:
            return
        if self._held is None:
            self._events.arguments(delta)
            return
        self._held.append(delta)
        so_far = "".join(self._held)
        if not any(name == self._name and args.startswith(so_far) for name, args in self._made):
            self._release()

    def call_done(self, arguments: str, *, complete: bool = True) -> None:
        if self.repeated:
            return
        if self._held is not None:
            if complete and (self._name, arguments) in self._made:
                self._held = None
                self.repeated = True
                return
            self._release()
        self._made.append((self._name, arguments))
        self._events.call_done(arguments, complete=complete)
