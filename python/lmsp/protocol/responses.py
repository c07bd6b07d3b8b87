"""The response object (§6.2): what the sync view returns, GET reads back and a task ends with."""

from __future__ import annotations

from pydantic_core import core_schema as cs

from .errors import PROBLEM
from .items import OUTPUT_ITEM
from .schema import field, literal, obj, text, typed_id

__all__ = ["INCOMPLETE_DETAILS", "INCOMPLETE_REASONS", "RESPONSE", "STATUSES", "USAGE"]

STATUSES = ("in_progress", "completed", "incomplete", "failed", "cancelled")
# max_output_tokens is the draft's; context_length (the window filled up) is the profile's.
INCOMPLETE_REASONS = ("max_output_tokens", "context_length")

_count = cs.int_schema(strict=True, ge=0)

INPUT_TOKENS_DETAILS = obj(
    {
        "cached_tokens": field(
            _count,
            doc="Input tokens whose KV cells were reused from an earlier request (a shared prefix), not decoded again.",
        )
    },
    "InputTokensDetails",
)

USAGE = obj(
    {
        "input_tokens": field(_count),
        "input_tokens_details": field(INPUT_TOKENS_DETAILS, required=False),
        "output_tokens": field(_count),
        "output_tokens_details": field(
            obj({"reasoning_tokens": field(_count)}, "OutputTokensDetails"),
            required=False,
            doc="reasoning_tokens: the output tokens a thinking model spent thinking (part of output_tokens).",
        ),
        "total_tokens": field(_count),
    },
    "Usage",
    doc="Token counts; input_tokens are counted after the model's chat template.",
)

INCOMPLETE_DETAILS = obj({"reason": field(literal(*INCOMPLETE_REASONS))}, "IncompleteDetails")

RESPONSE = obj(
    {
        "id": field(typed_id("resp")),
        "object": field(literal("response")),
        "created_at": field(_count, doc="Unix seconds."),
        "status": field(literal(*STATUSES)),
        "model": field(text),
        "output": field(cs.list_schema(OUTPUT_ITEM, strict=True)),
        "usage": field(cs.nullable_schema(USAGE), doc="null when the response ended before tokens were counted."),
        "error": field(cs.nullable_schema(PROBLEM), doc="The problem when status is failed, else null."),
        "incomplete_details": field(
            cs.nullable_schema(INCOMPLETE_DETAILS), doc="The reason when status is incomplete."
        ),
    },
    "Response",
    doc="A response object. A sync response is final: completed or incomplete.",
)
