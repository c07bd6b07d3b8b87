"""The OpenAI event stream of a response, projected from its LMSP events as they are appended
and framed once into a log of its own, which every reader of that stream (the POST's, a
resumed one) copies out as LMSP readers do theirs.

One LMSP event becomes one or more OpenAI events: `response.created` is followed by
`response.in_progress`, a message's `output_item.added` by its `content_part.added`, its
`output_item.done` preceded by `output_text.done` and `content_part.done` (a call's by its
arguments' or custom input's `.done`). Each carries a
`sequence_number`: its id in this log (1, 2, …), written by the log itself
(`append_numbered`), so `starting_after=N` is `frames_after(N)`. The text deltas, the hot
path, never come through here: the run's own log mirrors them into this one, framed in the
same Rust call that frames the LMSP delta (`mirror_text`).
"""

from __future__ import annotations

from typing import Any

import orjson

from lmsp._core import EventLog, EventLogClosed

from ...protocol import events as ev
from ...service.responses import ResponseRun
from .objects import output_item, output_text, response_object

__all__ = ["FINAL_EVENTS", "Projection"]

# LMSP final event → OpenAI's. OpenAI has no `response.cancelled`: a cancelled response ends
# `response.failed`, its status `cancelled`.
FINAL_EVENTS = {
    ev.COMPLETED: "response.completed",
    ev.INCOMPLETE: "response.incomplete",
    ev.FAILED: "response.failed",
    ev.CANCELLED: "response.failed",
}
TEXT_DELTA = "response.output_text.delta"
_NUMBER = b',"sequence_number":'


class Projection:
    """An EventTap (service/builder.py) writing the OpenAI events of one run."""

    def __init__(self, log: EventLog, echo: dict[str, Any]) -> None:
        self.log = log
        self.echo = echo
        self._run: ResponseRun | None = None
        self._indexes: dict[str, int] = {}  # item id → output index
        self._custom: dict[str, bool] = {}  # item id → a custom tool's call (its deltas are input)

    def started(self, run: ResponseRun) -> None:
        self._run = run

    def _response(self, final: tuple[str, bytes] | None = None) -> dict[str, Any]:
        assert self._run is not None
        return response_object(self._run.snapshot(final), self.echo)

    def _emit(self, name: str, body: dict[str, Any]) -> None:
        try:
            self.log.append_numbered(name, orjson.dumps({"type": name, **body})[:-1], _NUMBER)
        except EventLogClosed:  # ended early (shutdown): the rest has nowhere to go
            pass

    def event(self, name: str, data: dict[str, Any]) -> None:
        if name == ev.CREATED:
            response = self._response()
            self._emit("response.created", {"response": response})
            self._emit("response.in_progress", {"response": response})
        elif name == ev.ITEM_ADDED:
            self._added(data["output_index"], data["item"])
        elif name == ev.ARGUMENTS_DELTA:
            item_id = data["item_id"]
            custom = self._custom.get(item_id, False)
            self._emit(
                "response.custom_tool_call_input.delta" if custom else "response.function_call_arguments.delta",
                {"item_id": item_id, "output_index": self._indexes[item_id], "delta": data["delta"]},
            )
        elif name == ev.ITEM_DONE:
            self._done(data["output_index"], data["item"])
        elif name == ev.REASONING_DELTA:
            self._emit(
                "response.reasoning_summary_text.delta",
                {
                    "item_id": data["item_id"],
                    "output_index": data["output_index"],
                    "summary_index": data["summary_index"],
                    "delta": data["delta"],
                },
            )

    def _added(self, index: int, item: dict[str, Any]) -> None:
        self._indexes[item["id"]] = index
        self._custom[item["id"]] = item["type"] == "custom_tool_call"
        self._emit("response.output_item.added", {"output_index": index, "item": output_item(item)})
        if item["type"] == "reasoning":
            where = {"item_id": item["id"], "output_index": index, "summary_index": 0}
            self._emit("response.reasoning_summary_part.added", {**where, "part": {"type": "summary_text", "text": ""}})
        if item["type"] == "message":
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            self._emit("response.content_part.added", {**where, "part": output_text("")})
            assert self._run is not None
            head = orjson.dumps({"type": TEXT_DELTA, **where})[:-1] + b',"delta":'
            self._run.log.mirror_text(self.log, TEXT_DELTA, head, b',"logprobs":[]' + _NUMBER)

    def _done(self, index: int, item: dict[str, Any]) -> None:
        public = output_item(item)
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            text = "".join(part["text"] for part in item["content"])
            self._emit("response.output_text.done", {**where, "content_index": 0, "text": text, "logprobs": []})
            self._emit("response.content_part.done", {**where, "content_index": 0, "part": output_text(text)})
        elif item["type"] == "function_call":
            self._emit(
                "response.function_call_arguments.done",
                {**where, "name": public["name"], "arguments": item["arguments"]},
            )
        elif item["type"] == "custom_tool_call":
            self._emit("response.custom_tool_call_input.done", {**where, "input": item["input"]})
        elif item["type"] == "reasoning":
            # OpenAI's order: the summary part's text done, then the part, then the item.
            for i, part in enumerate(item["summary"]):
                self._emit("response.reasoning_summary_text.done", {**where, "summary_index": i, "text": part["text"]})
                self._emit("response.reasoning_summary_part.done", {**where, "summary_index": i, "part": part})
        self._emit("response.output_item.done", {"output_index": index, "item": public})

    def final(self, name: str, data: bytes) -> None:
        if name == ev.ERROR:
            problem = orjson.loads(data)["error"]
            self._emit("error", {"code": problem["code"], "message": problem["detail"], "param": problem.get("param")})
        else:
            self._emit(FINAL_EVENTS[name], {"response": self._response((name, data))})
        self.log.close()
