"""Input and output items (§6.1, §6.2, §6.5) and their content parts, as pydantic-core schemas."""

from __future__ import annotations

from pydantic_core import core_schema as cs

from .schema import field, literal, obj, text, typed_id

__all__ = [
    "FUNCTION_CALL",
    "INPUT_ITEM",
    "ITEM_STATUS",
    "OUTPUT_ITEM",
    "OUTPUT_MESSAGE",
    "RESERVED_CONTENT_TYPES",
]

# Image, audio and file parts are reserved by LMSP 1.0 (R6.1-2): the schema leaves them out,
# and request validation turns their tags into `unsupported_content_type`.
RESERVED_CONTENT_TYPES = ("input_image", "input_audio", "input_file")

# Profile R6.3-7: `in_progress` only in `response.output_item.added`; a done item is
# `completed`, or `incomplete` when max_output_tokens or the window cut it short (a cut call's
# arguments are then unfinished JSON: clients learn it from this field, not from a parse error).
ITEM_STATUS = literal("in_progress", "completed", "incomplete")

INPUT_TEXT = obj({"type": field(literal("input_text")), "text": field(text)}, "InputText")
OUTPUT_TEXT = obj({"type": field(literal("output_text")), "text": field(text)}, "OutputText")
SUMMARY_TEXT = obj({"type": field(literal("summary_text")), "text": field(text)}, "SummaryText")

INPUT_MESSAGE = obj(
    {
        "type": field(literal("message")),
        "role": field(literal("system", "user", "assistant")),
        "content": field(
            cs.list_schema(
                cs.tagged_union_schema({"input_text": INPUT_TEXT, "output_text": OUTPUT_TEXT}, discriminator="type"),
                min_length=1,
                strict=True,
            ),
            doc="Text parts; an assistant message may carry the output_text parts it was given.",
        ),
        "id": field(text, required=False, doc="The id of an output message sent back as input."),
        "status": field(ITEM_STATUS, required=False, doc="The status of an output message sent back as input."),
    },
    "InputMessage",
)

INPUT_FUNCTION_CALL = obj(
    {
        "type": field(literal("function_call")),
        "id": field(text, required=False),
        "call_id": field(text),
        "name": field(text),
        "arguments": field(text, doc="The arguments as a JSON-encoded string, as the service sent them."),
        "status": field(ITEM_STATUS, required=False, doc="The status of the call as the service sent it."),
    },
    "InputFunctionCall",
)

FUNCTION_CALL_OUTPUT = obj(
    {
        "type": field(literal("function_call_output")),
        "call_id": field(text, doc="The call_id of the function_call this answers."),
        "output": field(text, doc="The tool's result, usually JSON-encoded."),
    },
    "FunctionCallOutput",
)

INPUT_REASONING = obj(
    {
        "type": field(literal("reasoning")),
        "id": field(typed_id("rs"), required=False),
        "summary": field(cs.list_schema(SUMMARY_TEXT, strict=True)),
    },
    "InputReasoning",
    doc="A thinking model's earlier thinking, sent back: rendered as the model's template expects "
    "(most drop an earlier turn's thinking; some keep it within the turn of a tool call).",
)

INPUT_ITEM = cs.tagged_union_schema(
    {
        "message": INPUT_MESSAGE,
        "function_call": INPUT_FUNCTION_CALL,
        "function_call_output": FUNCTION_CALL_OUTPUT,
        "reasoning": INPUT_REASONING,
    },
    discriminator="type",
)

OUTPUT_MESSAGE = obj(
    {
        "id": field(typed_id("msg")),
        "type": field(literal("message")),
        "role": field(literal("assistant")),
        "content": field(
            cs.list_schema(OUTPUT_TEXT, strict=True),
            doc="Empty in `response.output_item.added`; the whole text once the item is done.",
        ),
        "status": field(ITEM_STATUS),
    },
    "OutputMessage",
)

FUNCTION_CALL = obj(
    {
        "id": field(typed_id("fc")),
        "type": field(literal("function_call")),
        "call_id": field(typed_id("call")),
        "name": field(text),
        "arguments": field(text, doc="A JSON-encoded string; unfinished JSON when status is incomplete."),
        "status": field(ITEM_STATUS),
    },
    "FunctionCall",
)

REASONING = obj(
    {
        "id": field(typed_id("rs")),
        "type": field(literal("reasoning")),
        "summary": field(cs.list_schema(SUMMARY_TEXT, strict=True)),
    },
    "Reasoning",
)

OUTPUT_ITEM = cs.tagged_union_schema(
    {"message": OUTPUT_MESSAGE, "function_call": FUNCTION_CALL, "reasoning": REASONING},
    discriminator="type",
)
