"""Semantic stream events (§6.3) and the response object they add up to (§6.2).

The EventLog holds events only; a response object is always derived from them by `fold`, so
the sync view, a stored response and a task's result cannot disagree with the stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

__all__ = [
    "CANCELLED",
    "COMPLETED",
    "CREATED",
    "ERROR",
    "FAILED",
    "FINAL_EVENTS",
    "INCOMPLETE",
    "ITEM_ADDED",
    "ITEM_DONE",
    "TEXT_DELTA",
    "fold",
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

FINAL_EVENTS = frozenset({COMPLETED, INCOMPLETE, FAILED, CANCELLED, ERROR})


def fold(
    entries: Iterable[tuple[int, str, bytes]],
    *,
    response_id: str,
    created_at: int,
    model: str,
) -> dict[str, Any]:
    """The response object as of the events seen so far (final once a final event is in)."""
    status = "in_progress"
    output: list[Any] = []
    usage = None
    error = None
    incomplete_details = None
    for _id, event, data in entries:
        if event == ITEM_DONE:
            done = orjson.loads(data)
            index = done["output_index"]
            output.extend([None] * (index + 1 - len(output)))
            output[index] = done["item"]
        elif event in FINAL_EVENTS:
            final = orjson.loads(data)
            if event == ERROR:
                status, error = "failed", final["error"]
                continue
            status = final["status"]
            usage = final.get("usage")
            error = final.get("error")
            incomplete_details = final.get("incomplete_details")
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "model": model,
        "output": [item for item in output if item is not None],
        "usage": usage,
        "error": error,
        "incomplete_details": incomplete_details,
    }
