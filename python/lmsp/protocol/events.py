"""Semantic stream events (§6.3) and the response object they add up to (§6.2).

The EventLog holds events only; a response object is always derived from them by `fold`, so
the sync view, a stored response and a task's result cannot disagree with the stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from pydantic_core import core_schema as cs

from .errors import PROBLEM
from .items import OUTPUT_ITEM
from .responses import INCOMPLETE_DETAILS, USAGE
from .schema import field, literal, obj, text, typed_id

__all__ = [
    "ARGUMENTS_DELTA",
    "CANCELLED",
    "COMPLETED",
    "CREATED",
    "ERROR",
    "EVENT_DATA",
    "FAILED",
    "FINAL_EVENTS",
    "INCOMPLETE",
    "ITEM_ADDED",
    "ITEM_DONE",
    "REASONING_DELTA",
    "TEXT_DELTA",
    "fold",
    "response_object",
]

CREATED = "response.created"
ITEM_ADDED = "response.output_item.added"
TEXT_DELTA = "response.output_text.delta"
ITEM_DONE = "response.output_item.done"
COMPLETED = "response.completed"
INCOMPLETE = "response.incomplete"
FAILED = "response.failed"
CANCELLED = "response.cancelled"
ERROR = "error"
# Profile R6.3-5: an extra event type clients that do not know it ignore.
ARGUMENTS_DELTA = "response.function_call_arguments.delta"
# Profile §6.3 (issue 29): a thinking model's thinking, as it comes, into its reasoning item's
# one summary_text part; clients that do not know it ignore it.
REASONING_DELTA = "response.reasoning_summary_text.delta"

FINAL_EVENTS = frozenset({COMPLETED, INCOMPLETE, FAILED, CANCELLED, ERROR})

_rid = field(typed_id("resp"))
_index = field(cs.int_schema(strict=True, ge=0))


def _status(value: str) -> cs.TypedDictField:
    return field(literal(value))


# The `data` object of every event the service sends (R6.3-2, R6.3-5).
EVENT_DATA: dict[str, cs.CoreSchema] = {
    CREATED: obj({"response_id": _rid, "status": _status("in_progress")}, "ResponseCreated"),
    ITEM_ADDED: obj({"response_id": _rid, "output_index": _index, "item": field(OUTPUT_ITEM)}, "OutputItemAdded"),
    TEXT_DELTA: obj({"response_id": _rid, "item_id": field(text), "delta": field(text)}, "OutputTextDelta"),
    ARGUMENTS_DELTA: obj(
        {"response_id": _rid, "item_id": field(text), "delta": field(text)}, "FunctionCallArgumentsDelta"
    ),
    REASONING_DELTA: obj(
        {
            "response_id": _rid,
            "item_id": field(text),
            "output_index": _index,
            "summary_index": _index,
            "delta": field(text),
        },
        "ReasoningSummaryTextDelta",
        doc="A thinking model's thinking as it comes; the deltas add up to the reasoning item's summary text.",
    ),
    ITEM_DONE: obj({"response_id": _rid, "output_index": _index, "item": field(OUTPUT_ITEM)}, "OutputItemDone"),
    COMPLETED: obj({"response_id": _rid, "status": _status("completed"), "usage": field(USAGE)}, "ResponseCompleted"),
    INCOMPLETE: obj(
        {
            "response_id": _rid,
            "status": _status("incomplete"),
            "incomplete_details": field(INCOMPLETE_DETAILS),
            "usage": field(USAGE),
        },
        "ResponseIncomplete",
    ),
    FAILED: obj({"response_id": _rid, "status": _status("failed"), "error": field(PROBLEM)}, "ResponseFailed"),
    CANCELLED: obj({"response_id": _rid, "status": _status("cancelled")}, "ResponseCancelled"),
    ERROR: obj({"error": field(PROBLEM)}, "ErrorEvent", doc="A problem not tied to one response; the stream ends."),
}


def fold(
    entries: Iterable[tuple[int, str, bytes]],
    *,
    response_id: str,
    created_at: int,
    model: str,
) -> dict[str, Any]:
    """The response object as of the events seen so far (final once a final event is in):
    what a reader of the stream can rebuild, and must get equal to the service's own."""
    output: list[Any] = []
    final: tuple[str, bytes] | None = None
    for _id, event, data in entries:
        if event == ITEM_DONE:
            done = orjson.loads(data)
            index = done["output_index"]
            output.extend([None] * (index + 1 - len(output)))
            output[index] = done["item"]
        elif event in FINAL_EVENTS:
            final = (event, data)
    items = [item for item in output if item is not None]
    return response_object(items, final, response_id=response_id, created_at=created_at, model=model)


def response_object(
    items: list[dict[str, Any]],
    final: tuple[str, bytes] | None,
    *,
    response_id: str,
    created_at: int,
    model: str,
) -> dict[str, Any]:
    """The response object from its finished items and its final event (None: in progress)."""
    status = "in_progress"
    usage = error = incomplete_details = None
    if final is not None:
        event, data = final
        body = orjson.loads(data)
        if event == ERROR:
            status, error = "failed", body["error"]
        else:
            status = body["status"]
            usage = body.get("usage")
            error = body.get("error")
            incomplete_details = body.get("incomplete_details")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": items,
        "usage": usage,
        "error": error,
        "incomplete_details": incomplete_details,
    }
