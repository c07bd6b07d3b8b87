"""Turns one sequence's generated text into semantic events in its EventLog.

It is the backend's sink: it runs on the backend's thread, once per token, so the hot path
(`on_text`) is a single call into Rust that frames the delta without building a dict.

The final event goes through `seal`, which appends it and closes the log exactly once, whoever
calls it first: the backend finishing, the service after storing the response, or the service
aborting every stream at shutdown (R6.3-3: one final event, then the stream ends).

The builder also keeps every finished item and the final event itself: a log's ring may drop
the oldest events of a long response, and the response object must not lose an item for it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import orjson

from lmsp._core import EventLog, EventLogClosed

from ..engine.schema_check import OutputCheck
from ..engine.sequence import FinishReason
from ..engine.tools import CallFormat
from ..protocol import events as ev
from ..protocol.errors import problem
from ..protocol.ids import new_id
from .toolcalls import CallSplitter, RepeatGuard

__all__ = ["EventBuilder", "EventTap", "FinalHook"]

_INCOMPLETE_REASONS = {"max_output_tokens", "context_length"}

# Receives the final event (name, JSON data) instead of the log, on the backend's thread; it
# must not block, and must see that `seal` is called eventually.
FinalHook = Callable[[str, bytes], None]


class EventTap(Protocol):
    """A second view of a response, fed with each event as it enters the log (on the thread
    that appends it), so that it can frame its own events once for all its readers."""

    def started(self, run: Any) -> None:
        """The run (a ResponseRun) it follows, before its first event."""
        ...

    def event(self, name: str, data: dict[str, Any]) -> None:
        """Every event but the text deltas: those, the hot path, a tap gets by mirroring the
        run's log into its own (`EventLog.mirror_text`), framed in the same Rust call."""
        ...

    def final(self, name: str, data: bytes) -> None: ...


class EventBuilder:
    """`calls`: the frame of function calls when the response has tools; the output may then
    hold calls besides (or instead of) one message. It is split as it streams, and a message
    item exists only if there is text."""

    def __init__(
        self,
        log: EventLog,
        response_id: str,
        on_final: FinalHook | None = None,
        *,
        calls: CallFormat | None = None,
        tap: EventTap | None = None,
    ) -> None:
        self.log = log
        self.response_id = response_id
        self.item_id = new_id("msg")
        self._on_final = on_final
        self._tap = tap
        self._item_open = False
        self._item_index = 0
        self._next_index = 0
        self._text: list[str] = []
        # A repeated call ends the output (toolcalls.RepeatGuard), on every face alike.
        self._guard: RepeatGuard | None = None
        self._splitter: CallSplitter | None = None
        if calls is not None:
            self._guard = RepeatGuard(self)
            self._splitter = CallSplitter(self._guard, calls)
        self._call: dict[str, object] = {}
        self._call_field = "arguments"
        self._call_index = 0
        # Finished items in output order; appended on the backend's thread, read as a copy.
        self._done: list[dict[str, Any]] = []
        self._final_event: tuple[str, bytes] | None = None
        # Output tokens a thinking model spent thinking (service/reasoning.ThinkingSink counts them).
        self.reasoning_tokens = 0
        # Tokens generated, as the backend reported at the end (a token's quota is charged them).
        self.output_tokens = 0
        self._sealed = False
        self._seal_lock = threading.Lock()
        # Set by the service when the output's schema, or a tool's parameters, are enforced in
        # part (engine.schema_check): the message at the end, each call when it is written.
        self.output_check: OutputCheck | None = None
        self.call_checks: dict[str, OutputCheck] = {}
        self._broken: str | None = None
        # `{"response_id":…,"item_id":…,"delta":` + JSON string + `}`: framed in Rust.
        self._delta_head = orjson.dumps({"response_id": response_id, "item_id": self.item_id})[:-1] + b',"delta":'

    def _append(self, event: str, data: dict[str, Any]) -> None:
        try:
            self.log.append(event, orjson.dumps(data))
        except EventLogClosed:  # sealed early (shutdown): the rest has nowhere to go
            return
        if self._tap is not None:
            self._tap.event(event, data)

    def created(self) -> None:
        self._append(ev.CREATED, {"response_id": self.response_id, "status": "in_progress"})

    def seal(self, event: str, data: bytes) -> bool:
        """Appends the final event and closes the log; False if it was already sealed."""
        return self.claim() and self.finish(event, data)

    def claim(self) -> bool:
        """Takes the right to end the response, for one who must store it before `finish`:
        whoever else ends it (the service stopping) then knows it lost; False if taken."""
        with self._seal_lock:
            if self._sealed:
                return False
            self._sealed = True
            return True

    def finish(self, event: str, data: bytes) -> bool:
        """Appends the final event and closes the log, once `claim` returned True; False if
        the log was closed already."""
        self._final_event = (event, data)
        try:
            self.log.append(event, data)
        except EventLogClosed:
            return False
        if self._tap is not None:
            self._tap.final(event, data)
        self.log.close()
        return True

    def response(self, *, created_at: int, model: str, final: tuple[str, bytes] | None = None) -> dict[str, Any]:
        """The response object as of now: every finished item, and the final event's status
        (`final`: one not sealed yet, e.g. while it is being stored)."""
        return ev.response_object(
            list(self._done),
            final or self._final_event,
            response_id=self.response_id,
            created_at=created_at,
            model=model,
        )

    def _final(self, event: str, data: dict[str, object]) -> None:
        body = orjson.dumps(data)
        if self._on_final is None:
            self.seal(event, body)
        else:
            self._on_final(event, body)

    def _item_done(self, index: int, item: dict[str, Any]) -> None:
        self._done.append(item)
        self._append(ev.ITEM_DONE, {"response_id": self.response_id, "output_index": index, "item": item})

    def _message(self, text: str | None, status: str) -> dict[str, object]:
        content = [] if text is None else [{"type": "output_text", "text": text}]
        return {"id": self.item_id, "type": "message", "role": "assistant", "content": content, "status": status}

    def _take_index(self) -> int:
        index = self._next_index
        self._next_index += 1
        return index

    def _open_item(self) -> None:
        self._item_open = True
        self._item_index = self._take_index()
        item = self._message(None, "in_progress")
        self._append(ev.ITEM_ADDED, {"response_id": self.response_id, "output_index": self._item_index, "item": item})

    def _close_item(self, status: str = "completed") -> None:
        if not self._item_open:
            self._open_item()
        self._item_open = False
        self._item_done(self._item_index, self._message("".join(self._text), status))

    def text(self, text: str) -> None:
        """Message text: the hot path without tools, the splitter's text with them."""
        if not self._item_open:
            self._open_item()
        self._text.append(text)
        try:
            self.log.append_text(ev.TEXT_DELTA, self._delta_head, text, b"}")
        except EventLogClosed:
            return

    def _end_output(self, status: str) -> None:
        """Closes whatever is open (R6.3-7): every item added gets its done."""
        if status != "completed" and self._done and self._done[-1]["type"] == "reasoning" and not self._item_open:
            return  # cut inside its thinking: no answer was begun
        if self._splitter is None:
            self._close_item(status)  # a response without tools always has its one message
            return
        self._splitter.flush(cut=status != "completed")
        if self._item_open:
            self._close_item(status)

    # --- CallEvents: the splitter's output, when the response has tools --------------------

    def call_started(self, name: str) -> None:
        self._start_call("function_call", "fc", "arguments", name)

    def custom_call_started(self, name: str) -> None:
        """Its `input` is text in the tool's grammar; its input deltas are argument deltas in
        the log, told apart by the item's type."""
        self._start_call("custom_tool_call", "ctc", "input", name)

    def _start_call(self, kind: str, prefix: str, field: str, name: str) -> None:
        if self._item_open:  # text before the calls: its message is complete
            self._close_item()
        self._call_index = self._take_index()
        self._call_field = field
        self._call = {
            "id": new_id(prefix),
            "type": kind,
            "call_id": new_id("call"),
            "name": name,
            field: "",
            "status": "in_progress",
        }
        self._append(
            ev.ITEM_ADDED, {"response_id": self.response_id, "output_index": self._call_index, "item": self._call}
        )

    def arguments(self, delta: str) -> None:
        self._append(ev.ARGUMENTS_DELTA, {"response_id": self.response_id, "item_id": self._call["id"], "delta": delta})

    def call_done(self, arguments: str, *, complete: bool = True) -> None:
        check = self.call_checks.get(str(self._call["name"])) if self._call_field == "arguments" else None
        if complete and check is not None and self._broken is None:
            self._broken = check.error(arguments)
        item = {**self._call, self._call_field: arguments, "status": "completed" if complete else "incomplete"}
        self._item_done(self._call_index, item)

    # --- ReasoningEvents: a thinking model's thinking (service/reasoning.py) ---------------

    def reasoning_started(self) -> None:
        """A reasoning item, before the message or calls that follow it (profile §6.2)."""
        self._reasoning = {"id": new_id("rs"), "type": "reasoning", "summary": []}
        self._reasoning_index = self._take_index()
        self._reasoning_text: list[str] = []
        self._append(
            ev.ITEM_ADDED,
            {"response_id": self.response_id, "output_index": self._reasoning_index, "item": self._reasoning},
        )

    def reasoning(self, delta: str) -> None:
        self._reasoning_text.append(delta)
        where = {"response_id": self.response_id, "item_id": self._reasoning["id"]}
        self._append(
            ev.REASONING_DELTA, {**where, "output_index": self._reasoning_index, "summary_index": 0, "delta": delta}
        )

    def reasoning_done(self) -> None:
        """Local models have no separate summarizer: the summary is the thinking itself."""
        text = "".join(self._reasoning_text)
        summary = [{"type": "summary_text", "text": text}] if text else []
        self._item_done(self._reasoning_index, {**self._reasoning, "summary": summary})

    # --- Sink ------------------------------------------------------------------------------

    def on_text(self, text: str) -> bool:
        if self._splitter is None:
            self.text(text)
            return False
        self._splitter.feed(text)
        # A call made again: the output ends here, as if it had ended on its own.
        return self._guard is not None and self._guard.repeated

    def on_finish(self, reason: FinishReason, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> None:
        self.output_tokens = output_tokens
        usage = {
            "input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": cached_tokens},
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        if self.reasoning_tokens:
            usage["output_tokens_details"] = {"reasoning_tokens": min(self.reasoning_tokens, output_tokens)}
        rid = self.response_id
        if reason == "cancelled":
            self._close_open()
            self._final(ev.CANCELLED, {"response_id": rid, "status": "cancelled"})
            return
        if reason in _INCOMPLETE_REASONS:
            self._end_output("incomplete")
            self._final(
                ev.INCOMPLETE,
                {"response_id": rid, "status": "incomplete", "incomplete_details": {"reason": reason}, "usage": usage},
            )
        elif (broken := self._broken_schema()) is not None:
            self.on_error(broken)
        else:
            self._end_output("completed")
            self._final(ev.COMPLETED, {"response_id": rid, "status": "completed", "usage": usage})

    def _broken_schema(self) -> str | None:
        """Why the finished output breaks what its grammar could not enforce (uniqueItems,
        dependencies, oneOf: engine.schema_check), or None."""
        if self._broken is None and self.output_check is not None:
            self._broken = self.output_check.error("".join(self._text))
        return self._broken

    def on_error(self, message: str) -> None:
        self._close_open()
        error = problem("generation_failed", message)
        self._final(ev.FAILED, {"response_id": self.response_id, "status": "failed", "error": error})

    def _close_open(self) -> None:
        """A response that ends early (cancelled, failed) still closes what it opened, cut."""
        if self._splitter is not None:
            self._splitter.flush(cut=True)
        if self._item_open:
            self._close_item("incomplete")
