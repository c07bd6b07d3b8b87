"""The request bodies of the OpenAI-compatible face (`/v1`), as pydantic-core schemas: what the
face validates and what the OpenAPI document says, from one source (as protocol/ does for LMSP).

Fields follow the OpenAI API reference. Unknown fields are refused (as OpenAI answers an
unknown parameter); fields the service cannot honour are in the schema and refused, or
accepted and left out, by `translate` and `chat`, which say why for each.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import core_schema as cs

from ...protocol.schema import field, literal, obj, text
from ..sampling import CACHE_SALT_MAX, TOP_K_MAX

__all__ = ["CHAT_REQUEST", "RESPONSES_REQUEST"]

_json_object = cs.dict_schema(keys_schema=cs.str_schema(), strict=True)
_bool = cs.nullable_schema(cs.bool_schema(strict=True))
_opt_text = cs.nullable_schema(text)
_cache_salt = cs.nullable_schema(cs.str_schema(strict=True, min_length=1, max_length=CACHE_SALT_MAX))
_CACHE_SALT_DOC = (
    "Not OpenAI's: vLLM's. Cached prompt cells are reused only by requests of the same owner "
    "that send the same salt (an lmsp extension)."
)
_name = cs.str_schema(strict=True, pattern="^[A-Za-z0-9_-]{1,64}$")
_temperature = cs.nullable_schema(cs.float_schema(strict=True, ge=0.0, le=2.0, allow_inf_nan=False))
_top_p = cs.nullable_schema(cs.float_schema(strict=True, ge=0.0, le=1.0, allow_inf_nan=False))
_tokens = cs.nullable_schema(cs.int_schema(strict=True, ge=1))
_metadata = cs.nullable_schema(
    cs.dict_schema(
        keys_schema=cs.str_schema(strict=True, max_length=64),
        values_schema=cs.str_schema(strict=True, max_length=512),
        max_length=16,
        strict=True,
    )
)
# What an open-ended object the service drops allows: any fields.
_loose = {"extra_behavior": "allow"}


def _tagged(choices: dict[str, cs.CoreSchema], default: str | None = None) -> cs.CoreSchema:
    """A union told by `type` (absent: `default`, as OpenAI's easy input messages have none)."""
    if default is None:
        return cs.tagged_union_schema(choices, discriminator="type")

    def tag(value: Any) -> Any:
        return value.get("type", default) if isinstance(value, dict) else None

    return cs.tagged_union_schema(choices, discriminator=tag)


def _loose_obj(kind: str, name: str) -> cs.TypedDictSchema:
    return cs.typed_dict_schema({"type": field(literal(kind))}, ref=f"lmsp.{name}", **_loose)  # type: ignore[arg-type]


# --- Responses: POST /v1/responses -----------------------------------------------------------

_INPUT_TEXT = obj({"type": field(literal("input_text")), "text": field(text)}, "OpenAIInputText")
_OUTPUT_TEXT = obj(
    {
        "type": field(literal("output_text")),
        "text": field(text),
        "annotations": field(cs.list_schema(_json_object), required=False),
        "logprobs": field(cs.list_schema(_json_object), required=False),
    },
    "OpenAIOutputText",
)
_REFUSAL = obj({"type": field(literal("refusal")), "refusal": field(text)}, "OpenAIRefusal")
# Images, files and audio: the schema names them so that refusing them says what they are.
_MEDIA = {
    kind: _loose_obj(kind, f"OpenAI{kind.title().replace('_', '')}")
    for kind in ("input_image", "input_file", "input_audio")
}
_PARTS = cs.list_schema(
    _tagged({"input_text": _INPUT_TEXT, "output_text": _OUTPUT_TEXT, "refusal": _REFUSAL, **_MEDIA}), strict=True
)

_MESSAGE = obj(
    {
        "type": field(literal("message"), required=False),
        "role": field(literal("user", "assistant", "system", "developer")),
        "content": field(cs.union_schema([text, _PARTS])),
        "id": field(text, required=False),
        "status": field(literal("in_progress", "completed", "incomplete"), required=False),
    },
    "OpenAIInputMessage",
)
_FUNCTION_CALL = obj(
    {
        "type": field(literal("function_call")),
        "call_id": field(text),
        "name": field(text),
        "namespace": field(_opt_text, required=False),
        "arguments": field(text),
        "id": field(text, required=False),
        "status": field(literal("in_progress", "completed", "incomplete"), required=False),
    },
    "OpenAIFunctionCall",
)
_OUTPUT = cs.union_schema([text, cs.list_schema(_tagged({"input_text": _INPUT_TEXT, **_MEDIA}), strict=True)])
_FUNCTION_CALL_OUTPUT = obj(
    {
        "type": field(literal("function_call_output")),
        "call_id": field(text),
        "output": field(_OUTPUT),
        "id": field(_opt_text, required=False),
        "status": field(cs.nullable_schema(literal("in_progress", "completed", "incomplete")), required=False),
    },
    "OpenAIFunctionCallOutput",
)
_CUSTOM_CALL = obj(
    {
        "type": field(literal("custom_tool_call")),
        "call_id": field(text),
        "name": field(text),
        "namespace": field(_opt_text, required=False),
        "input": field(text),
        "id": field(text, required=False),
        "status": field(literal("in_progress", "completed", "incomplete"), required=False),
    },
    "OpenAICustomToolCall",
)
_CUSTOM_CALL_OUTPUT = obj(
    {
        "type": field(literal("custom_tool_call_output")),
        "call_id": field(text),
        "output": field(_OUTPUT),
        "id": field(_opt_text, required=False),
    },
    "OpenAICustomToolCallOutput",
)
# What Codex sends back of its own turns that the model here never makes: accepted, dropped.
_DROPPED_ITEMS = ("reasoning", "local_shell_call", "local_shell_call_output", "web_search_call")

INPUT_ITEM = _tagged(
    {
        "message": _MESSAGE,
        "function_call": _FUNCTION_CALL,
        "function_call_output": _FUNCTION_CALL_OUTPUT,
        "custom_tool_call": _CUSTOM_CALL,
        "custom_tool_call_output": _CUSTOM_CALL_OUTPUT,
        **{kind: _loose_obj(kind, "OpenAI" + kind.title().replace("_", "")) for kind in _DROPPED_ITEMS},
    },
    default="message",
)

_FUNCTION_TOOL = obj(
    {
        "type": field(literal("function")),
        "name": field(_name),
        "description": field(_opt_text, required=False),
        "parameters": field(cs.nullable_schema(_json_object), required=False),
        "strict": field(_bool, required=False),
    },
    "OpenAIFunctionTool",
)
_GRAMMAR = obj(
    {"type": field(literal("grammar")), "syntax": field(literal("lark", "regex")), "definition": field(text)},
    "OpenAIGrammarFormat",
)
_CUSTOM_TOOL = obj(
    {
        "type": field(literal("custom")),
        "name": field(_name),
        "description": field(_opt_text, required=False),
        "format": field(
            _tagged({"text": obj({"type": field(literal("text"))}, "OpenAITextToolFormat"), "grammar": _GRAMMAR}),
            required=False,
        ),
    },
    "OpenAICustomTool",
)
# Function and custom tools grouped under a name (Codex CLI sends its sub-agent tools so):
# the model sees each as `namespace.name`, and its calls carry `namespace` and `name` apart.
_NAMESPACE_TOOL = obj(
    {
        "type": field(literal("namespace")),
        "name": field(_name),
        "description": field(_opt_text, required=False),
        "tools": field(cs.list_schema(_tagged({"function": _FUNCTION_TOOL, "custom": _CUSTOM_TOOL}), strict=True)),
    },
    "OpenAINamespaceTool",
)
# Tools Codex always sends, which the service cannot run: accepted and left out of the prompt.
DROPPED_TOOLS = ("local_shell", "web_search", "web_search_preview")
TOOL = _tagged(
    {
        "function": _FUNCTION_TOOL,
        "custom": _CUSTOM_TOOL,
        "namespace": _NAMESPACE_TOOL,
        **{kind: _loose_obj(kind, "OpenAI" + kind.title().replace("_", "") + "Tool") for kind in DROPPED_TOOLS},
    }
)
_TOOL_CHOICE = cs.union_schema(
    [
        literal("auto", "none", "required"),
        obj({"type": field(literal("function", "custom")), "name": field(text)}, "OpenAIToolChoiceNamed"),
    ]
)

_JSON_SCHEMA_FORMAT = obj(
    {
        "type": field(literal("json_schema")),
        "name": field(cs.str_schema(strict=True, pattern="^[A-Za-z0-9_-]{1,64}$")),
        "schema": field(_json_object),
        "description": field(_opt_text, required=False),
        "strict": field(_bool, required=False),
    },
    "OpenAIJsonSchemaFormat",
)
TEXT_FORMAT = _tagged(
    {
        "text": obj({"type": field(literal("text"))}, "OpenAITextFormat"),
        "json_schema": _JSON_SCHEMA_FORMAT,
        "json_object": obj({"type": field(literal("json_object"))}, "OpenAIJsonObjectFormat"),
    }
)

# Values OpenAI's `include` takes; none adds anything here (no reasoning, logprobs, search).
INCLUDABLE = (
    "reasoning.encrypted_content",
    "message.output_text.logprobs",
    "message.input_image.image_url",
    "computer_call_output.output.image_url",
    "file_search_call.results",
    "web_search_call.results",
    "web_search_call.action.sources",
    "code_interpreter_call.outputs",
)

RESPONSES_REQUEST = obj(
    {
        "model": field(cs.str_schema(strict=True, min_length=1)),
        "input": field(
            cs.union_schema([text, cs.list_schema(INPUT_ITEM, strict=True)]), doc="A user message, or items."
        ),
        "instructions": field(
            _opt_text, required=False, doc="A system message before the input (not carried to a continuation)."
        ),
        "max_output_tokens": field(_tokens, required=False),
        "temperature": field(_temperature, required=False, doc="Default 1."),
        "top_p": field(_top_p, required=False),
        "text": field(
            cs.nullable_schema(
                obj(
                    {
                        "format": field(TEXT_FORMAT, required=False),
                        "verbosity": field(cs.nullable_schema(literal("low", "medium", "high")), required=False),
                    },
                    "OpenAITextConfig",
                )
            ),
            required=False,
        ),
        "tools": field(cs.list_schema(TOOL, strict=True), required=False),
        "tool_choice": field(_TOOL_CHOICE, required=False),
        "parallel_tool_calls": field(_bool, required=False, doc="Default true: up to 4 calls."),
        "store": field(_bool, required=False, doc="Default true."),
        "previous_response_id": field(_opt_text, required=False),
        "background": field(_bool, required=False, doc="Run as a task: poll, resume its stream, cancel."),
        "stream": field(_bool, required=False),
        "stream_options": field(
            cs.nullable_schema(
                obj({"include_obfuscation": field(_bool, required=False)}, "OpenAIResponseStreamOptions")
            ),
            required=False,
        ),
        "metadata": field(_metadata, required=False),
        "client_metadata": field(
            cs.nullable_schema(_json_object),
            required=False,
            doc="Accepted and ignored (Codex CLI sends its session's).",
        ),
        "user": field(_opt_text, required=False),
        "safety_identifier": field(_opt_text, required=False),
        "prompt_cache_key": field(_opt_text, required=False),
        "cache_salt": field(_cache_salt, required=False, doc=_CACHE_SALT_DOC),
        "include": field(cs.nullable_schema(cs.list_schema(literal(*INCLUDABLE), strict=True)), required=False),
        "reasoning": field(
            cs.nullable_schema(
                obj(
                    {
                        "effort": field(
                            cs.nullable_schema(literal("none", "minimal", "low", "medium", "high", "xhigh")),
                            required=False,
                        ),
                        "summary": field(cs.nullable_schema(literal("auto", "concise", "detailed")), required=False),
                        "generate_summary": field(
                            cs.nullable_schema(literal("auto", "concise", "detailed")), required=False
                        ),
                    },
                    "OpenAIReasoningConfig",
                )
            ),
            required=False,
        ),
        "service_tier": field(
            cs.nullable_schema(literal("auto", "default", "flex", "scale", "priority")), required=False
        ),
        "truncation": field(cs.nullable_schema(literal("disabled", "auto")), required=False),
        "top_logprobs": field(cs.nullable_schema(cs.int_schema(strict=True, ge=0, le=20)), required=False),
        "max_tool_calls": field(cs.nullable_schema(cs.int_schema(strict=True, ge=1)), required=False),
        "extensions": field(
            cs.nullable_schema(_json_object),
            required=False,
            doc="LMSP's extensions (not OpenAI's): `seed`, `top_k`, `min_p`, `repeat_penalty`, `presence_penalty`, "
            "`frequency_penalty`, `schema_narrowing`; other keys are ignored.",
        ),
    },
    "OpenAIResponseRequest",
    doc="The body of POST /v1/responses (the OpenAI Responses API).",
)

# --- Chat Completions: POST /v1/chat/completions --------------------------------------------

_CHAT_TEXT = obj({"type": field(literal("text")), "text": field(text)}, "OpenAIChatText")
_CHAT_MEDIA = {
    kind: _loose_obj(kind, "OpenAIChat" + kind.title().replace("_", ""))
    for kind in ("image_url", "input_audio", "file")
}
_chat_text_content = cs.union_schema([text, cs.list_schema(_tagged({"text": _CHAT_TEXT}), strict=True)])
_chat_user_content = cs.union_schema([text, cs.list_schema(_tagged({"text": _CHAT_TEXT, **_CHAT_MEDIA}), strict=True)])
_CHAT_TOOL_CALL = obj(
    {
        "id": field(text),
        "type": field(literal("function")),
        "function": field(obj({"name": field(text), "arguments": field(text)}, "OpenAIChatCallFunction")),
    },
    "OpenAIChatToolCall",
)
_CHAT_MESSAGE = cs.tagged_union_schema(
    {
        "system": obj(
            {
                "role": field(literal("system")),
                "content": field(_chat_text_content),
                "name": field(text, required=False),
            },
            "OpenAIChatSystemMessage",
        ),
        "developer": obj(
            {
                "role": field(literal("developer")),
                "content": field(_chat_text_content),
                "name": field(text, required=False),
            },
            "OpenAIChatDeveloperMessage",
        ),
        "user": obj(
            {"role": field(literal("user")), "content": field(_chat_user_content), "name": field(text, required=False)},
            "OpenAIChatUserMessage",
        ),
        "assistant": obj(
            {
                "role": field(literal("assistant")),
                "content": field(cs.nullable_schema(_chat_text_content), required=False),
                "tool_calls": field(cs.list_schema(_CHAT_TOOL_CALL, strict=True), required=False),
                "refusal": field(_opt_text, required=False),
                "name": field(text, required=False),
            },
            "OpenAIChatAssistantMessage",
        ),
        "tool": obj(
            {"role": field(literal("tool")), "content": field(_chat_text_content), "tool_call_id": field(text)},
            "OpenAIChatToolMessage",
        ),
    },
    discriminator="role",
)
_CHAT_TOOL = obj(
    {
        "type": field(literal("function")),
        "function": field(
            obj(
                {
                    "name": field(_name),
                    "description": field(_opt_text, required=False),
                    "parameters": field(cs.nullable_schema(_json_object), required=False),
                    "strict": field(_bool, required=False),
                },
                "OpenAIChatFunction",
            )
        ),
    },
    "OpenAIChatTool",
)
_CHAT_TOOL_CHOICE = cs.union_schema(
    [
        literal("auto", "none", "required"),
        obj(
            {
                "type": field(literal("function")),
                "function": field(obj({"name": field(text)}, "OpenAIChatNamedFunction")),
            },
            "OpenAIChatToolChoiceNamed",
        ),
    ]
)
_CHAT_RESPONSE_FORMAT = _tagged(
    {
        "text": obj({"type": field(literal("text"))}, "OpenAIChatTextFormat"),
        "json_object": obj({"type": field(literal("json_object"))}, "OpenAIChatJsonObjectFormat"),
        "json_schema": obj(
            {
                "type": field(literal("json_schema")),
                "json_schema": field(
                    obj(
                        {
                            "name": field(cs.str_schema(strict=True, pattern="^[A-Za-z0-9_-]{1,64}$")),
                            "schema": field(_json_object, required=False),
                            "description": field(_opt_text, required=False),
                            "strict": field(_bool, required=False),
                        },
                        "OpenAIChatJsonSchema",
                    )
                ),
            },
            "OpenAIChatJsonSchemaFormat",
        ),
    }
)
_penalty = cs.nullable_schema(cs.float_schema(strict=True, ge=-2.0, le=2.0, allow_inf_nan=False))

CHAT_REQUEST = obj(
    {
        "model": field(cs.str_schema(strict=True, min_length=1)),
        "messages": field(cs.list_schema(_CHAT_MESSAGE, min_length=1, strict=True)),
        "max_tokens": field(_tokens, required=False),
        "max_completion_tokens": field(_tokens, required=False),
        "temperature": field(_temperature, required=False),
        "top_p": field(_top_p, required=False),
        "seed": field(cs.nullable_schema(cs.int_schema(strict=True)), required=False),
        "stop": field(
            cs.nullable_schema(cs.union_schema([text, cs.list_schema(text, max_length=4, strict=True)])), required=False
        ),
        "response_format": field(_CHAT_RESPONSE_FORMAT, required=False),
        "tools": field(cs.list_schema(_CHAT_TOOL, strict=True), required=False),
        "tool_choice": field(_CHAT_TOOL_CHOICE, required=False),
        "parallel_tool_calls": field(_bool, required=False),
        "stream": field(_bool, required=False),
        "stream_options": field(
            cs.nullable_schema(
                obj(
                    {
                        "include_usage": field(_bool, required=False),
                        "include_obfuscation": field(_bool, required=False),
                    },
                    "OpenAIChatStreamOptions",
                )
            ),
            required=False,
        ),
        "n": field(cs.nullable_schema(cs.int_schema(strict=True, ge=1, le=128)), required=False, doc="Only 1."),
        "user": field(_opt_text, required=False),
        "safety_identifier": field(_opt_text, required=False),
        "prompt_cache_key": field(_opt_text, required=False),
        "cache_salt": field(_cache_salt, required=False, doc=_CACHE_SALT_DOC),
        "metadata": field(_metadata, required=False),
        "store": field(_bool, required=False),
        "logprobs": field(_bool, required=False),
        "top_logprobs": field(cs.nullable_schema(cs.int_schema(strict=True, ge=0, le=20)), required=False),
        "frequency_penalty": field(_penalty, required=False),
        "presence_penalty": field(_penalty, required=False),
        # Not OpenAI's: the names llama-server and vLLM accept (the SDKs' `extra_body`).
        "top_k": field(
            cs.nullable_schema(cs.int_schema(strict=True, ge=0, le=TOP_K_MAX)), required=False, doc="0: off."
        ),
        "reasoning_budget": field(
            cs.nullable_schema(cs.int_schema(strict=True, ge=1, le=1 << 20)),
            required=False,
            doc="Thinking tokens at most, for a thinking model (an lmsp extension; counts toward the output's limit).",
        ),
        "min_p": field(
            cs.nullable_schema(cs.float_schema(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)), required=False
        ),
        "repeat_penalty": field(
            cs.nullable_schema(cs.float_schema(strict=True, ge=0.0, le=10.0, allow_inf_nan=False)),
            required=False,
            doc="1: off.",
        ),
        "logit_bias": field(
            cs.nullable_schema(
                cs.dict_schema(keys_schema=text, values_schema=cs.int_schema(strict=True, ge=-100, le=100))
            ),
            required=False,
        ),
        "reasoning_effort": field(
            cs.nullable_schema(literal("none", "minimal", "low", "medium", "high", "xhigh")), required=False
        ),
        "service_tier": field(
            cs.nullable_schema(literal("auto", "default", "flex", "scale", "priority")), required=False
        ),
        "modalities": field(cs.nullable_schema(cs.list_schema(literal("text", "audio"), strict=True)), required=False),
    },
    "OpenAIChatRequest",
    doc="The body of POST /v1/chat/completions (the OpenAI Chat Completions API).",
)
