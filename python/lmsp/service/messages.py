"""From input items (history included) to the chat messages a model's template renders.

A template that knows tools (`CallFormat.native`) gets calls as `tool_calls` on the assistant
turn and results as `tool` turns, in the shape Hugging Face chat templates read. Any other
gets calls back as the Hermes text the model would have written for them, results as
`<tool_response>` user turns (every template knows that role, not every one knows "tool"),
and the tools described in the system message. Either way a round trip reads to the model as
one conversation (R6.5-4).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from ..engine.tools import (
    MISTRAL,
    CallFormat,
    call_text,
    custom_call_text,
    parameters_of,
    tool_prompt,
    tool_result_text,
)
from ..protocol.errors import ProblemError

__all__ = ["chat_messages", "template_tools", "with_tool_prompt"]


def _param(i: int, n_history: int, field: str) -> str:
    return "previous_response_id" if i < n_history else f"input[{i - n_history}].{field}"


def _template_call_id(call_id: str, calls: CallFormat) -> str:
    # Mistral's templates refuse any id but 9 alphanumerics; ours are longer, so a stable digest.
    return hashlib.sha256(call_id.encode()).hexdigest()[:9] if calls is MISTRAL else call_id


def _arguments(arguments: str) -> Any:
    """Templates write `arguments | tojson`, so they get the object; a call cut short
    (unfinished JSON) goes back as the text it is."""
    try:
        return orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments


def chat_messages(
    items: Sequence[Mapping[str, Any]], n_history: int, *, tools: bool, calls: CallFormat | None = None
) -> list[dict[str, Any]]:
    """`tools`: the model has the capability (else call items are refused); `calls`: its
    frame, when the template renders calls itself."""
    native = calls is not None and calls.native
    messages: list[dict[str, Any]] = []
    known: dict[str, str] = {}  # call_id → tool name
    last_was_call = False
    thinking: str | None = None  # a reasoning item's text, for the assistant turn after it
    for i, item in enumerate(items):
        kind = item["type"]
        if kind == "reasoning":  # the model's thinking: not a turn of its own
            thinking = "".join(part.get("text", "") for part in item.get("summary") or [])
            continue
        before = len(messages)
        if kind != "message" and not tools:
            raise ProblemError(
                "unsupported_capability",
                f"input item of type {kind!r} needs the 'tools' capability, which this model lacks",
                param=_param(i, n_history, "type"),
            )
        if kind == "message":
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": item["role"], "content": text})
        elif kind in ("function_call", "custom_tool_call"):
            known[item["call_id"]] = item["name"]
            custom = kind == "custom_tool_call"
            if native:
                assert calls is not None
                call = {
                    "id": _template_call_id(item["call_id"], calls),
                    "type": "function",
                    # A custom call's input is text: it goes as the text it is.
                    "function": {
                        "name": item["name"],
                        "arguments": item["input"] if custom else _arguments(item["arguments"]),
                    },
                }
                last = messages[-1] if messages else None
                # Text and calls of one turn, or parallel calls: one assistant turn.
                if last is not None and last["role"] == "assistant" and (last_was_call or "tool_calls" not in last):
                    last.setdefault("tool_calls", []).append(call)
                else:
                    messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            else:
                text = (
                    custom_call_text(item["name"], item["input"])
                    if custom
                    else call_text(item["name"], item["arguments"])
                )
                if last_was_call:  # parallel calls: one assistant turn, as the model wrote them
                    messages[-1]["content"] += "\n" + text
                else:
                    messages.append({"role": "assistant", "content": text})
        else:  # function_call_output (custom_tool_call_output from the OpenAI face)
            call_id = item["call_id"]
            if call_id not in known:
                raise ProblemError(
                    "invalid_request",
                    f"{kind} for call_id {call_id!r} follows no call with that call_id",
                    param=_param(i, n_history, "call_id"),
                )
            if native:
                assert calls is not None
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": _template_call_id(call_id, calls),
                        "name": known[call_id],
                        "content": item["output"],
                    }
                )
            else:
                messages.append({"role": "user", "content": tool_result_text(item["output"])})
        last_was_call = kind in ("function_call", "custom_tool_call")
        if thinking is not None and len(messages) > before and messages[-1]["role"] == "assistant":
            # Given to the template as the two names templates read (Qwen3 `reasoning_content`,
            # gpt-oss `thinking`); the template decides what to keep: most drop an earlier
            # turn's thinking, and keep it within the turn of a tool call, as the model wrote it.
            if thinking:
                messages[-1]["reasoning_content"] = messages[-1]["thinking"] = thinking
            thinking = None
    return messages


def template_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The request's tools as chat templates read them (the Chat Completions shape)."""
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t.get("description", ""), "parameters": parameters_of(t)},
        }
        for t in tools
    ]


def with_tool_prompt(messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tools described in the system message (appended to the client's own, if any)."""
    section = tool_prompt(tools)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + section}, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]
