"""The task object (§7): a response generated whether or not anyone listens."""

from __future__ import annotations

from pydantic_core import core_schema as cs

from .responses import RESPONSE, STATUSES
from .schema import field, literal, obj, typed_id

__all__ = ["TASK"]

TASK = obj(
    {
        "id": field(typed_id("task")),
        "object": field(literal("task")),
        "status": field(literal(*STATUSES), doc="The response's status; in_progress until it is final."),
        "created_at": field(cs.int_schema(strict=True, ge=0), doc="Unix seconds."),
        "response_id": field(typed_id("resp")),
        "response": field(cs.nullable_schema(RESPONSE), doc="The final response object; null until the task ends."),
    },
    "Task",
)
