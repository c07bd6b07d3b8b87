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
from .items import INPUT_ITEM, RESERVED_CONTENT_TYPES
from .schema import field, literal, obj, text

__all__ = ["REQUEST", "check_tools", "parse_json_body", "validate_response_request", "validation_problem"]

_json_object = cs.dict_schema(keys_schema=cs.str_schema(), strict=True)

TOOL = obj(
    {
        "type": field(literal("function")),
        "name": field(cs.str_schema(strict=True, pattern="^[A-Za-z0-9_-]{1,64}$")),
        "description": field(text, required=False),
        "parameters": field(_json_object, required=False, doc="A JSON Schema for the arguments."),
    },
    "FunctionTool",
)

TOOL_CHOICE = cs.union_schema(
    [
        literal("auto", "none", "required"),
        obj({"type": field(literal("function")), "name": field(text)}, "NamedToolChoice"),
    ],
)

RESPONSE_FORMAT = cs.tagged_union_schema(
    {
        "text": obj({"type": field(literal("text"))}, "TextFormat"),
        "json_schema": obj(
            {
                "type": field(literal("json_schema")),
                "json_schema": field(
                    obj(
                        {
                            "name": field(text),
                            "schema": field(_json_object),
                            "description": field(text, required=False),
                            "strict": field(cs.bool_schema(strict=True), required=False),
                        },
                        "JsonSchemaSpec",
                    )
                ),
            },
            "JsonSchemaFormat",
        ),
    },
    discriminator="type",
)

REQUEST = obj(
    {
        "model": field(cs.str_schema(strict=True, min_length=1), doc="A model id from GET /lmsp/v1/models."),
        "input": field(cs.list_schema(INPUT_ITEM, min_length=1, strict=True), doc="Input items, oldest first."),
        "stream": field(
            cs.bool_schema(strict=True), required=False, doc="true: an SSE stream of events. Default false."
        ),
        "max_output_tokens": field(cs.int_schema(strict=True, ge=1), required=False),
        "temperature": field(
            cs.float_schema(strict=True, ge=0.0, le=2.0, allow_inf_nan=False), required=False, doc="Default 1.0."
        ),
        "response_format": field(RESPONSE_FORMAT, required=False, doc='Default {"type": "text"}.'),
        "tools": field(cs.list_schema(TOOL, strict=True), required=False),
        "tool_choice": field(TOOL_CHOICE, required=False),
        "store": field(cs.bool_schema(strict=True), required=False, doc="Keep the response for GET and continuation."),
        "previous_response_id": field(
            cs.nullable_schema(cs.str_schema(strict=True, min_length=1)),
            required=False,
            doc="Continue from a stored response: its input and output come before this input.",
        ),
        "extensions": field(
            cs.dict_schema(keys_schema=cs.str_schema(), strict=True),
            required=False,
            doc="Private extensions; unknown keys are ignored. `seed` (integer) makes sampling repeatable; "
            "`top_k`, `min_p`, `repeat_penalty`, `presence_penalty` and `frequency_penalty` set llama.cpp's samplers "
            "(out of range: 400 naming `extensions.<name>`); `cache_salt` (1 to 256 characters): only requests "
            "with the same salt, of the same owner, reuse each other's cached prompt cells; `schema_narrowing` "
            "(boolean): false compiles a JSON schema as given, without the service's narrowing.",
        ),
    },
    "ResponseRequest",
    doc="The body of POST /lmsp/v1/responses.",
)

_validator = SchemaValidator(REQUEST)


def parse_json_body(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ProblemError("invalid_json", f"the body is not valid JSON: {exc}") from None


def _json_path(loc: tuple[int | str, ...], body: Any, kind: str) -> str:
    """`('input', 0, 'message', 'role')` → `input[0].role`: union tags and branch labels in
    loc are not keys of the body; the last one is, when the error says it is missing."""
    path = ""
    node = body
    for i, key in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(key, int):
            path += f"[{key}]"
            node = node[key] if isinstance(node, list) and 0 <= key < len(node) else None
            continue
        if not (isinstance(node, dict) and key in node) and not (last and kind == "missing"):
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


def _reserved_part(error: Any) -> bool:
    """A content part whose tag LMSP 1.0 reserves (image, audio, file), not an unknown one."""
    loc = error["loc"]
    return (
        error["type"] == "union_tag_invalid"
        and len(loc) >= 2
        and loc[-2] == "content"
        and error.get("ctx", {}).get("tag") in RESERVED_CONTENT_TYPES
    )


def validate_response_request(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ProblemError("invalid_request", "the body must be a JSON object", param="")
    try:
        request: dict[str, Any] = _validator.validate_python(body)
    except ValidationError as exc:
        raise validation_problem(exc, body) from None
    check_tools(request)
    return request


def validation_problem(exc: ValidationError, body: Any) -> ProblemError:
    """The first error of a body's validation, naming the field by its JSON path."""
    first = exc.errors(include_url=False)[0]
    path = _json_path(tuple(first["loc"]), body, first["type"])
    if first["type"] in ("union_tag_invalid", "union_tag_not_found"):
        path += ".type"
    if _reserved_part(first):
        kind = first["ctx"]["tag"]
        return ProblemError(
            "unsupported_content_type",
            f"content type {kind!r} is reserved in LMSP 1.0; only text is supported",
            param=path,
        )
    return ProblemError("invalid_request", f"{path or 'body'}: {_describe(first)}", param=path)


def check_tools(request: dict[str, Any]) -> None:
    """What a schema cannot say about tools (profile R6.5-2): unique names, a named choice
    that exists."""
    names: set[str] = set()
    for i, tool in enumerate(request.get("tools", ())):
        if tool["name"] in names:
            raise ProblemError("invalid_request", f"two tools are named {tool['name']!r}", param=f"tools[{i}].name")
        names.add(tool["name"])
    choice = request.get("tool_choice")
    if choice == "required" and not names:
        raise ProblemError("invalid_request", "tool_choice 'required' needs at least one tool", param="tool_choice")
    if isinstance(choice, dict) and choice["name"] not in names:
        raise ProblemError(
            "invalid_request", f"tool_choice names {choice['name']!r}, which is not in tools", param="tool_choice.name"
        )
