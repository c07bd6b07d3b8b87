"""The request bodies of the Anthropic face (`/v1/messages`, `/v1/messages/count_tokens`), as
pydantic-core schemas: what the face validates and what the OpenAPI document says, from one
source (as faces/openai/schema.py does).

Fields follow Anthropic's Messages API reference and its Python SDK's params. Unknown fields
are refused, as Anthropic answers "Extra inputs are not permitted"; fields that only tune
Anthropic's own service (`cache_control`, `service_tier`, `metadata`, `citations`, …) are
accepted and have no effect here: `translate` says which.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import core_schema as cs

from ...protocol.schema import field, literal, obj, text
from ..sampling import TOP_K_MAX

__all__ = ["COUNT_TOKENS_REQUEST", "MESSAGES_REQUEST", "SERVER_TOOL"]

_json_object = cs.dict_schema(keys_schema=cs.str_schema(), strict=True)
_any = cs.any_schema()
_opt_text = cs.nullable_schema(text)
# Prompt caching is the KV reuse the service does by itself: the marks are accepted and left out.
_cache = field(cs.nullable_schema(_json_object), required=False)
_loose = {"extra_behavior": "allow"}


def _tagged(choices: dict[str, cs.CoreSchema]) -> cs.CoreSchema:
    return cs.tagged_union_schema(choices, discriminator="type")


def _loose_obj(kind: str, name: str) -> cs.TypedDictSchema:
    return cs.typed_dict_schema({"type": field(literal(kind))}, ref=f"lmsp.{name}", **_loose)  # type: ignore[arg-type]


_TEXT = obj(
    {
        "type": field(literal("text")),
        "text": field(text),
        "cache_control": _cache,
        "citations": field(cs.nullable_schema(cs.list_schema(_any)), required=False),
    },
    "AnthropicTextBlock",
)
# Images, documents and search results: named, so that refusing them says what they are.
_MEDIA = {kind: _loose_obj(kind, f"Anthropic{kind.title().replace('_', '')}Block") for kind in ("image", "document")}
_TOOL_USE = obj(
    {
        "type": field(literal("tool_use")),
        "id": field(text),
        "name": field(text),
        "input": field(_json_object),
        "cache_control": _cache,
        "caller": field(_any, required=False),
    },
    "AnthropicToolUseBlock",
)
_TOOL_RESULT = obj(
    {
        "type": field(literal("tool_result")),
        "tool_use_id": field(text),
        "content": field(
            cs.union_schema([text, cs.list_schema(_tagged({"text": _TEXT, **_MEDIA}), strict=True)]), required=False
        ),
        "is_error": field(cs.nullable_schema(cs.bool_schema(strict=True)), required=False),
        "cache_control": _cache,
    },
    "AnthropicToolResultBlock",
)
# An earlier turn's thinking, sent back by clients that keep the whole history (Claude Code):
# accepted, and dropped from the prompt as Anthropic drops it from earlier turns.
_THINKING = _loose_obj("thinking", "AnthropicThinkingBlock")
_REDACTED_THINKING = _loose_obj("redacted_thinking", "AnthropicRedactedThinkingBlock")
_BLOCK = _tagged(
    {
        "text": _TEXT,
        "tool_use": _TOOL_USE,
        "tool_result": _TOOL_RESULT,
        "thinking": _THINKING,
        "redacted_thinking": _REDACTED_THINKING,
        **_MEDIA,
    }
)
_MESSAGE = obj(
    {
        "role": field(literal("user", "assistant")),
        "content": field(cs.union_schema([text, cs.list_schema(_BLOCK, strict=True)])),
    },
    "AnthropicMessageParam",
)
_SYSTEM = cs.union_schema([text, cs.list_schema(_TEXT, strict=True)])
_name = cs.str_schema(strict=True, pattern="^[a-zA-Z0-9_-]{1,128}$")
_TOOL = obj(
    {
        "type": field(cs.nullable_schema(literal("custom")), required=False),
        "name": field(_name),
        "description": field(text, required=False),
        "input_schema": field(_json_object),
        "cache_control": _cache,
        "strict": field(cs.bool_schema(strict=True), required=False),
        "input_examples": field(cs.list_schema(_json_object), required=False),
        "defer_loading": field(cs.bool_schema(strict=True), required=False),
        "eager_input_streaming": field(cs.nullable_schema(cs.bool_schema(strict=True)), required=False),
        "allowed_callers": field(cs.list_schema(_any), required=False),
    },
    "AnthropicTool",
)
# A server tool (web search, code execution, …) runs on Anthropic's side: told apart by a
# `type` other than `custom`, and refused by `translate`, which names it.
SERVER_TOOL = cs.typed_dict_schema(
    {"type": field(text), "name": field(text)},
    ref="lmsp.AnthropicServerTool",
    **_loose,  # type: ignore[arg-type]
)


def _tool(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    return "custom" if value.get("type") in (None, "custom") else "server"


_TOOLS = cs.list_schema(
    cs.tagged_union_schema({"custom": _TOOL, "server": SERVER_TOOL}, discriminator=_tool), strict=True
)
_parallel = field(cs.bool_schema(strict=True), required=False)
_TOOL_CHOICE = _tagged(
    {
        "auto": obj(
            {"type": field(literal("auto")), "disable_parallel_tool_use": _parallel}, "AnthropicToolChoiceAuto"
        ),
        "any": obj({"type": field(literal("any")), "disable_parallel_tool_use": _parallel}, "AnthropicToolChoiceAny"),
        "tool": obj(
            {"type": field(literal("tool")), "name": field(text), "disable_parallel_tool_use": _parallel},
            "AnthropicToolChoiceTool",
        ),
        "none": obj({"type": field(literal("none"))}, "AnthropicToolChoiceNone"),
    }
)
_display = field(cs.nullable_schema(literal("summarized", "omitted")), required=False)
_THINKING_CONFIG = _tagged(
    {
        "enabled": obj(
            {
                "type": field(literal("enabled")),
                "budget_tokens": field(cs.int_schema(strict=True, ge=1)),
                "display": _display,
            },
            "AnthropicThinkingEnabled",
        ),
        "adaptive": obj({"type": field(literal("adaptive")), "display": _display}, "AnthropicThinkingAdaptive"),
        "disabled": obj({"type": field(literal("disabled"))}, "AnthropicThinkingDisabled"),
    }
)
_OUTPUT_CONFIG = obj(
    {
        "effort": field(cs.nullable_schema(literal("low", "medium", "high", "xhigh", "max")), required=False),
        "format": field(
            cs.nullable_schema(
                obj(
                    {"type": field(literal("json_schema")), "schema": field(_json_object)},
                    "AnthropicJsonOutputFormat",
                )
            ),
            required=False,
        ),
    },
    "AnthropicOutputConfig",
)

# The fields both endpoints read: what makes the prompt.
_PROMPT: dict[str, cs.TypedDictField] = {
    "model": field(cs.str_schema(strict=True, min_length=1)),
    "messages": field(cs.list_schema(_MESSAGE, strict=True)),
    "system": field(_SYSTEM, required=False),
    "tools": field(_TOOLS, required=False),
    "tool_choice": field(_TOOL_CHOICE, required=False),
    "thinking": field(_THINKING_CONFIG, required=False),
    "output_config": field(_OUTPUT_CONFIG, required=False),
    "cache_control": _cache,
    "speed": field(cs.nullable_schema(literal("standard", "fast")), required=False),
}

MESSAGES_REQUEST = obj(
    {
        **_PROMPT,
        "max_tokens": field(cs.int_schema(strict=True, ge=1), doc="Required, as on Anthropic."),
        "stop_sequences": field(cs.list_schema(text, strict=True, max_length=16), required=False),
        "stream": field(cs.bool_schema(strict=True), required=False),
        # No longer in the newest SDK's signature (its `extra_body` sends them), but Claude Code
        # and older SDKs do send them.
        "temperature": field(
            cs.float_schema(strict=True, ge=0.0, le=1.0, allow_inf_nan=False), required=False, doc="Default 1."
        ),
        "top_p": field(cs.float_schema(strict=True, ge=0.0, le=1.0, allow_inf_nan=False), required=False),
        "top_k": field(cs.int_schema(strict=True, ge=0, le=TOP_K_MAX), required=False, doc="0: off."),
        "metadata": field(
            cs.nullable_schema(obj({"user_id": field(_opt_text, required=False)}, "AnthropicMetadata")),
            required=False,
        ),
        "service_tier": field(literal("auto", "standard_only"), required=False),
        "container": field(_any, required=False),
        "inference_geo": field(_opt_text, required=False),
        "context_management": field(cs.nullable_schema(_json_object), required=False),
        "mcp_servers": field(cs.list_schema(_json_object), required=False),
        "diagnostics": field(cs.nullable_schema(_json_object), required=False),
        "user_profile_id": field(text, required=False),
        "workspace_id": field(text, required=False),
    },
    "AnthropicMessagesRequest",
    doc="The body of POST /v1/messages (Anthropic's Messages API).",
)

COUNT_TOKENS_REQUEST = obj(
    _PROMPT,
    "AnthropicCountTokensRequest",
    doc="The body of POST /v1/messages/count_tokens.",
)
