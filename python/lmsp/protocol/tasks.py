"""The task object and the body that creates one (§7): a response generated whether or not
anyone listens."""

from __future__ import annotations

from pydantic_core import core_schema as cs

from .requests import REQUEST
from .responses import RESPONSE, STATUSES
from .schema import field, literal, obj, typed_id

__all__ = ["TASK", "TASK_REQUEST"]

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

# A task's events are read from its events endpoint, never streamed from the POST: the same
# fields as a responses request, less `stream` (which the service refuses, naming it).
TASK_REQUEST = obj(
    {name: spec for name, spec in REQUEST["fields"].items() if name != "stream"},
    "TaskRequest",
    doc="The body of POST /lmsp/v1/tasks: a responses request without `stream`.",
)
