"""From input items (history included) to the chat messages a model's template renders.

Function calls go back in as the assistant text the model would have written for them, and
their outputs as `<tool_response>` turns, so a round trip reads to the model as one
conversation (R6.5-4). The tools themselves are described in the system message.
"""

from __future__ import annotations

from typing import Any

from ..engine.tools import call_text, tool_prompt, tool_result_text
from ..protocol.errors import ProblemError

__all__ = ["chat_messages", "with_tool_prompt"]


def _param(i: int, n_history: int, field: str) -> str:
    return "previous_response_id" if i < n_history else f"input[{i - n_history}].{field}"


def chat_messages(items: list[dict[str, Any]], n_history: int, *, tools: bool) -> list[dict[str, str]]:
    """`tools`: the model has the capability (else call items are refused). Tool results are
    user turns: every template knows that role, not every one knows "tool"."""
    messages: list[dict[str, str]] = []
    calls: set[str] = set()
    last_was_call = False
    for i, item in enumerate(items):
        kind = item["type"]
        if kind == "reasoning":  # the model's own summary of its thinking: not a turn
            continue
        if kind != "message" and not tools:
            raise ProblemError(
                "unsupported_capability",
                f"input item of type {kind!r} needs the 'tools' capability, which this model lacks",
                param=_param(i, n_history, "type"),
            )
        if kind == "message":
            text = "".join(part["text"] for part in item["content"])
            messages.append({"role": item["role"], "content": text})
        elif kind == "function_call":
            calls.add(item["call_id"])
            text = call_text(item["name"], item["arguments"])
            if last_was_call:  # parallel calls: one assistant turn, as the model wrote them
                messages[-1]["content"] += "\n" + text
            else:
                messages.append({"role": "assistant", "content": text})
        else:  # function_call_output
            if item["call_id"] not in calls:
                raise ProblemError(
                    "invalid_request",
                    f"function_call_output for call_id {item['call_id']!r} follows no function_call with that call_id",
                    param=_param(i, n_history, "call_id"),
                )
            messages.append({"role": "user", "content": tool_result_text(item["output"])})
        last_was_call = kind == "function_call"
    return messages


def with_tool_prompt(messages: list[dict[str, str]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The tools described in the system message (appended to the client's own, if any)."""
    section = tool_prompt(tools)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + section}, *messages[1:]]
    return [{"role": "system", "content": section}, *messages]
