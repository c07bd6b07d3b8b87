"""The request body of `POST /lmsp/v1/responses`, validated by one pydantic-core schema.

Validation errors become `invalid_request` problems whose `param` is the JSON path of the
offending field (R6.1-8, R6.1-9); reserved content types become `unsupported_content_type`
(R6.1-2).
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic_core import SchemaValidator, ValidationError
from pydantic_core import core_schema as cs

from .errors import ProblemError

__all__ = ["RESERVED_CONTENT_TYPES", "parse_json_body", "validate_response_request"]

RESERVED_CONTENT_TYPES = ("input_image", "input_audio", "input_file")


def _f(schema: cs.CoreSchema, required: bool = True) -> cs.TypedDictField:
    return cs.typed_dict_field(schema, required=required)


def _obj(fields: dict[str, cs.TypedDictField]) -> cs.TypedDictSchema:
    return cs.typed_dict_schema(fields, extra_behavior="forbid")


_text = cs.str_schema(strict=True)


def _part(kind: str) -> cs.TypedDictSchema:
    return _obj({"type": _f(cs.literal_schema([kind])), "text": _f(_text)})


# Reserved parts pass validation here so that they can be refused with their own code.
_reserved_part = cs.typed_dict_schema({"type": _f(cs.str_schema())}, extra_behavior="allow")

_content_part = cs.tagged_union_schema(
    {
        "input_text": _part("input_text"),
        "output_text": _part("output_text"),
        **{kind: _reserved_part for kind in RESERVED_CONTENT_TYPES},
    },
    discriminator="type",
)

_message = _obj(
    {
        "type": _f(cs.literal_schema(["message"])),
        "role": _f(cs.literal_schema(["system", "user", "assistant"])),
        "content": _f(cs.list_schema(_content_part, min_length=1, strict=True)),
        "id": _f(_text, required=False),
    }
)

_function_call = _obj(
    {
        "type": _f(cs.literal_schema(["function_call"])),
        "id": _f(_text, required=False),
        "call_id": _f(_text),
        "name": _f(_text),
        "arguments": _f(_text),
    }
)

_function_call_output = _obj(
    {
        "type": _f(cs.literal_schema(["function_call_output"])),
        "call_id": _f(_text),
        "output": _f(_text),
    }
)

_input_item = cs.tagged_union_schema(
    {"message": _message, "function_call": _function_call, "function_call_output": _function_call_output},
    discriminator="type",
)

_response_format = cs.tagged_union_schema(
    {
        "text": _obj({"type": _f(cs.literal_schema(["text"]))}),
        "json_schema": _obj(
            {
                "type": _f(cs.literal_schema(["json_schema"])),
                "json_schema": _f(
                    _obj(
                        {
                            "name": _f(_text),
                            "schema": _f(cs.dict_schema(strict=True)),
                            "description": _f(_text, required=False),
                            "strict": _f(cs.bool_schema(strict=True), required=False),
                        }
                    )
                ),
            }
        ),
    },
    discriminator="type",
)

_request = _obj(
    {
        "model": _f(cs.str_schema(strict=True, min_length=1)),
        "input": _f(cs.list_schema(_input_item, min_length=1, strict=True)),
        "stream": _f(cs.bool_schema(strict=True), required=False),
        "max_output_tokens": _f(cs.int_schema(strict=True, ge=1), required=False),
        "temperature": _f(cs.float_schema(strict=True, ge=0.0, le=2.0, allow_inf_nan=False), required=False),
        "response_format": _f(_response_format, required=False),
        "tools": _f(cs.list_schema(cs.dict_schema(strict=True), strict=True), required=False),
        "tool_choice": _f(cs.any_schema(), required=False),
        "store": _f(cs.bool_schema(strict=True), required=False),
        "previous_response_id": _f(cs.nullable_schema(_text), required=False),
        "extensions": _f(cs.dict_schema(strict=True), required=False),
    }
)

_validator = SchemaValidator(_request)


def parse_json_body(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProblemError("invalid_json", f"the body is not valid JSON: {exc}") from None


def _json_path(loc: tuple[int | str, ...], body: Any) -> str:
    """`('input', 0, 'message', 'role')` → `input[0].role`: union tags in loc are not keys."""
    path = ""
    node = body
    for i, key in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(key, int):
            path += f"[{key}]"
            node = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
            continue
        if not last and not (isinstance(node, dict) and key in node):
            continue
        path += f".{key}" if path else key
        node = node.get(key) if isinstance(node, dict) else None
    return path


def _describe(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "field required"
    return str(error["msg"])


def validate_response_request(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProblemError("invalid_request", "the body must be a JSON object", param="")
    try:
        request: dict[str, Any] = _validator.validate_python(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        path = _json_path(tuple(first["loc"]), body)
        if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            path += ".type"
        raise ProblemError("invalid_request", f"{path or 'body'}: {_describe(first)}", param=path) from None
    for i, item in enumerate(request["input"]):
        for j, part in enumerate(item.get("content", ()) if item["type"] == "message" else ()):
            if part["type"] in RESERVED_CONTENT_TYPES:
                raise ProblemError(
                    "unsupported_content_type",
                    f"content type {part['type']!r} is reserved in LMSP 1.0; only text is supported",
                    param=f"input[{i}].content[{j}].type",
                )
    return request
