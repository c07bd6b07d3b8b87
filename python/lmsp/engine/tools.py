"""Function tools as the model sees them: how they are described in its prompt, how calls
are written, and the grammar that makes every call well-formed (R6.5-5).

A call is written `<tool_call>\\n{"name": NAME, "arguments": ARGS}\\n</tool_call>` (the Hermes
format many instruct models were tuned on); several calls are separated by one newline. The
grammar fixes every byte of that frame, so the service can split the output into text and
calls while it streams, and ARGS follows the tool's `parameters` schema.
"""

from __future__ import annotations

from typing import Any

import orjson

from lmsp._core import prepared_json_schema

__all__ = ["CALL_END", "CALL_START", "MAX_CALLS", "call_text", "parameters_of", "tool_grammar", "tool_prompt", "tool_result_text"]

CALL_START = "<tool_call>\n"
# JSON strings cannot hold a raw newline, so this never occurs inside the arguments.
CALL_END = "}\n</tool_call>"
# Calls one response may hold. Unbounded, a small model that has made its call tends to make it
# again and again until max_output_tokens; the client sends the results and asks again.
MAX_CALLS = 4
# A tool without `parameters` takes none.
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def parameters_of(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("parameters") or NO_ARGUMENTS


def call_head(name: str) -> str:
    return CALL_START + '{"name": ' + orjson.dumps(name).decode() + ', "arguments": '


def call_text(name: str, arguments: str) -> str:
    """A call as the model would have written it: how earlier calls go back into the prompt."""
    return call_head(name) + arguments + CALL_END


def tool_result_text(output: str) -> str:
    return f"<tool_response>\n{output}\n</tool_response>"


def tool_prompt(tools: list[dict[str, Any]]) -> str:
    """The system-prompt section that describes the tools, for templates that cannot."""
    described = "\n".join(
        orjson.dumps({"name": t["name"], "description": t.get("description", ""), "parameters": parameters_of(t)}).decode()
        for t in tools
    )
    return (
        "You may call functions to help with the user's request. The functions are:\n"
        f"<tools>\n{described}\n</tools>\n"
        "To call one, write only:\n"
        '<tool_call>\n{"name": <function name>, "arguments": <JSON arguments>}\n</tool_call>\n'
        "The result comes back in <tool_response></tool_response>."
    )


def _lark_string(text: str) -> str:
    return orjson.dumps(text).decode()


def tool_grammar(tools: list[dict[str, Any]], choice: str | dict[str, Any]) -> str:
    """The Lark grammar (llguidance's dialect) for a response with these tools and this
    `tool_choice`: `none` is text without calls, `required` one or more calls, a named
    choice exactly one call of it, `auto` text or calls or text followed by calls; never
    more than MAX_CALLS calls."""
    if isinstance(choice, dict):
        tools = [t for t in tools if t["name"] == choice["name"]]
    rules = []
    for i, tool in enumerate(tools):
        schema = prepared_json_schema(orjson.dumps(parameters_of(tool)).decode())
        rules.append(f"call_{i}: {_lark_string(call_head(tool['name']))} %json {schema} {_lark_string(CALL_END)}")
    start = {"none": "start: TEXT?", "required": "start: calls", "auto": "start: TEXT? calls?"}.get(
        choice if isinstance(choice, str) else "", "start: call"
    )
    calls = "call"
    for _ in range(MAX_CALLS - 1):
        calls = f'call ("\\n" {calls})?'
    lines = [start, f"calls: {calls}", "call: " + " | ".join(f"call_{i}" for i in range(len(tools))), *rules]
    if "TEXT" in start:
        # Free text, except that it never contains the start of a call.
        lines.append(f"TEXT: /(?s:.+)/ & ~/(?s:.*{CALL_START.strip()}.*)/")
    return "\n".join(lines) + "\n"
