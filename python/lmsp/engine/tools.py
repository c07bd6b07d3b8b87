"""Function tools as the model sees them: how they are described in its prompt, how calls
are written, and the grammar that makes every call well-formed (R6.5-5).

A call is written in its model's own frame (`CallFormat`). A template that renders tools
itself (it reads `tools` and `tool_calls`) gets them natively, and the grammar follows the
frame that template writes earlier calls in: Hermes `<tool_call>` blocks (Qwen 2.5/3, Hermes 2
Pro), Llama 3.1+'s bare `{"name": …, "parameters": …}`, Mistral's `[TOOL_CALLS][…]` list.
Any other template (SmolLM2's among them) gets the tools in a system-prompt section of ours
and the Hermes frame. Either way the grammar fixes every byte of the frame, so the service can
split the output into text and calls while it streams, and the arguments follow the tool's
`parameters` schema. A custom tool (the OpenAI face's) takes raw text in its own grammar
instead, written after its name's line in the Hermes frame (`CallFormat.custom_head`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import orjson

from lmsp._core import prepared_json_schema

from .schema_check import relax

__all__ = [
    "CUSTOM_CLOSER",
    "HERMES",
    "LLAMA3",
    "MAX_CALLS",
    "MISTRAL",
    "CallFormat",
    "NamedChoice",
    "ToolChoice",
    "call_format_of",
    "call_text",
    "custom_call_text",
    "closed_schema",
    "custom_input_rules",
    "enforced_parameters",
    "promised_parameters",
    "parameters_of",
    "tool_grammar",
    "tool_prompt",
    "tool_result_text",
]

# Calls one response may hold when the request allows parallel calls (R6.5-7); one otherwise.
# Unbounded, a small model that has made its call tends to make it again and again until
# max_output_tokens; the client sends the results and asks again.
MAX_CALLS = 4
# A tool without `parameters` takes none.
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class CallFormat:
    """The frame of a model's function calls: `prefix` + calls joined by `sep` + `suffix`,
    each call `opener` + `{"name": NAME, "<args_key>": ARGS` + `closer`, a regex (in the
    syntax Python and llguidance's Lark share) because the model may write something of its
    own there (Mistral's 9-character call id)."""

    name: str
    opener: str
    args_key: str
    closer: str
    sep: str = ""
    prefix: str = ""
    suffix: str = ""
    # Where text may come before the calls; False: the calls are the whole output.
    text_first: bool = True
    max_calls: int = MAX_CALLS
    # The template renders `tools` and `tool_calls` itself; else our system section describes them.
    native: bool = False

    @property
    def start(self) -> str:
        """What opens the calls; text never contains it."""
        return self.prefix + self.opener

    def head(self, name: str) -> str:
        return self.opener + '{"name": ' + orjson.dumps(name).decode() + f', "{self.args_key}": '

    def custom_head(self, name: str) -> str:
        """What opens a call of a custom tool (Hermes frames only): its input is raw text in
        the tool's own grammar, so it cannot sit inside the JSON; it follows the name's line."""
        return self.opener + '{"name": ' + orjson.dumps(name).decode() + "}\n"


HERMES = CallFormat("hermes", opener="<tool_call>\n", args_key="arguments", closer=r"\}\n</tool_call>", sep="\n")
# Llama 3.1+ templates render one call per turn and nothing else in it.
LLAMA3 = CallFormat(
    "llama3", opener="", args_key="parameters", closer=r"\}", text_first=False, max_calls=1, native=True
)
MISTRAL = CallFormat(
    "mistral",
    opener="",
    args_key="arguments",
    closer=r', "id": "[a-zA-Z0-9]{9}"\}',
    sep=", ",
    prefix="[TOOL_CALLS][",
    suffix="]",
    native=True,
)


def call_format_of(template: str) -> CallFormat:
    """The frame a chat template writes calls in, told by its own text."""
    if "tools" not in template or "tool_calls" not in template:
        return HERMES
    if "<tool_call>" in template:
        return replace(HERMES, native=True)
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if '"parameters": ' in template and "<|eot_id|>" in template:
        return LLAMA3
    return HERMES  # a frame we do not know: our own section and Hermes calls


def parameters_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("parameters") or NO_ARGUMENTS


# Keywords whose value is one subschema, or a list or a map of them, that `closed_schema`
# follows. `allOf` and `if`/`then`/`else` are not: each of those lists only part of the
# properties, and closing it would refuse the others' keys (and closing a `not` inverts it).
_ONE = ("items", "additionalItems", "contains", "additionalProperties")
_LIST = ("anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed_schema(schema: Any) -> Any:
    """A tool's parameters as they are enforced: an object schema that lists `properties` and
    says nothing of `additionalProperties` takes no other keys, as llama.cpp's own schema
    converter reads it (a small model otherwise invents keys, repeats them, and runs out of
    tokens); a schema that says `additionalProperties` keeps what it says."""
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ONE:
            out[key] = closed_schema(value)
        elif key in _LIST and isinstance(value, list):
            out[key] = [closed_schema(v) for v in value]
        elif key in _MAP and isinstance(value, Mapping):
            out[key] = {name: closed_schema(v) for name, v in value.items()}
        else:
            out[key] = value
    if isinstance(out.get("properties"), Mapping) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def promised_parameters(tool: Mapping[str, Any]) -> Any:
    """The schema a function tool's arguments are valid against (`closed_schema`)."""
    return closed_schema(parameters_of(tool))


def enforced_parameters(tool: Mapping[str, Any]) -> Any:
    """The part of it the grammar enforces: the rest is checked once the call is written
    (`schema_check`)."""
    return relax(promised_parameters(tool)).schema


# What ends a custom call's input. The input may contain it only where the grammar says so
# (see `tool_grammar`); the splitter takes it as the end when the output ends after it or the
# next call opens.
CUSTOM_CLOSER = "\n</tool_call>"


def call_text(name: str, arguments: str) -> str:
    """A Hermes call as the model would have written it: how earlier calls go back into a
    prompt whose template does not know tools."""
    return HERMES.head(name) + arguments + "}\n</tool_call>"


def custom_call_text(name: str, text: str) -> str:
    """A custom tool's call as the model would have written it."""
    return HERMES.custom_head(name) + text + CUSTOM_CLOSER


def tool_result_text(output: str) -> str:
    return f"<tool_response>\n{output}\n</tool_response>"


def _described(tool: Mapping[str, Any]) -> dict[str, Any]:
    if tool.get("type") != "custom":
        return {"name": tool["name"], "description": tool.get("description", ""), "parameters": parameters_of(tool)}
    form = tool.get("format") or {"type": "text"}
    grammar = {"text": "free text"} if form["type"] == "text" else {form["syntax"]: form["definition"]}
    return {"name": tool["name"], "description": tool.get("description", ""), "input": grammar}


def tool_prompt(tools: Sequence[Mapping[str, Any]]) -> str:
    """The system-prompt section that describes the tools, for templates that cannot."""
    described = "\n".join(orjson.dumps(_described(t)).decode() for t in tools)
    custom = any(t.get("type") == "custom" for t in tools)
    return (
        "You may call functions to help with the user's request. The functions are:\n"
        f"<tools>\n{described}\n</tools>\n"
        "To call one, write only:\n"
        '<tool_call>\n{"name": <function name>, "arguments": <JSON arguments>}\n</tool_call>\n'
        + (
            'A function with an "input" grammar instead takes raw text in that grammar:\n'
            '<tool_call>\n{"name": <function name>}\n<input>\n</tool_call>\n'
            if custom
            else ""
        )
        + "The result comes back in <tool_response></tool_response>."
    )


def _lark_string(text: str) -> str:
    return orjson.dumps(text).decode()


def _lark_regex_literal(text: str) -> str:
    return re.escape(text).replace("/", "\\/")


def _regex_literal(pattern: str) -> str:
    """A regex as a Lark `/.../` literal: its unescaped slashes and raw newlines escaped."""
    out = []
    escaped = False
    for c in pattern:
        if escaped:
            out.append("n" if c == "\n" else c)
            escaped = False
        elif c == "\\":
            out.append(c)
            escaped = True
        else:
            out.append({"/": "\\/", "\n": "\\n", "\r": "\\r"}.get(c, c))
    if escaped:  # a trailing lone backslash: kept, so the engine refuses the regex as it is
        out.append("\\")
    return "/" + "".join(out) + "/"


# No custom input (text or regex) holds the closer: it is a single lexeme, intersected with this.
_NO_CLOSER = r"~/(?s:.*\n<\/tool_call>.*)/"


def custom_input_rules(i: int, tool: Mapping[str, Any]) -> list[str]:
    """The rules of custom tool `i`'s input. A regex (or free text) is one lexeme, intersected
    with "never the closer", so where it ends is certain. A Lark grammar is nested whole
    (`%lark { … }`, its own rules and lexer, none of its names can clash with ours); its
    language may hold the closer only where the user's grammar allows it, and the splitter
    then ends the input at the first closer that the end of output or the next call follows."""
    form = tool.get("format") or {"type": "text"}
    if form["type"] == "grammar" and form["syntax"] == "lark":
        return [f"input_{i}: %lark {{\n{form['definition']}\n}}"]
    pattern = _regex_literal(form["definition"]) if form["type"] == "grammar" else "/(?s:.*)/"
    return [f"input_{i}: INPUT_{i}", f"INPUT_{i}: {pattern} & {_NO_CLOSER}"]


@dataclass(frozen=True)
class NamedChoice:
    """`tool_choice` naming one tool: the model must call exactly it."""

    name: str


ToolChoice = Literal["auto", "none", "required"] | NamedChoice


def tool_grammar(
    tools: Sequence[Mapping[str, Any]], choice: ToolChoice, calls: CallFormat = HERMES, *, parallel: bool = False
) -> str:
    """The Lark grammar (llguidance's dialect) for a response with these tools and this
    `tool_choice`: `none` is text without calls, `required` calls, a named choice one call
    of it, `auto` text or calls (or text then calls, where the frame allows). One call
    unless `parallel` (then up to the frame's cap); after the calls the output ends."""
    if isinstance(choice, NamedChoice):
        tools = [t for t in tools if t["name"] == choice.name]
    closer = "/" + calls.closer.replace("/", "\\/") + "/"
    rules = []
    for i, tool in enumerate(tools):
        if tool.get("type") == "custom":
            head = _lark_string(calls.custom_head(tool["name"]))
            rules += [f"call_{i}: {head} input_{i} {_lark_string(CUSTOM_CLOSER)}", *custom_input_rules(i, tool)]
            continue
        schema = prepared_json_schema(orjson.dumps(enforced_parameters(tool)).decode())
        rules.append(f"call_{i}: {_lark_string(calls.head(tool['name']))} %json {schema} {closer}")
    many = calls.max_calls if parallel and not isinstance(choice, NamedChoice) else 1
    inner = "call"
    for _ in range(many - 1):
        inner = f"call ({_lark_string(calls.sep)} {inner})?"
    framed = " ".join(
        p
        for p in (
            _lark_string(calls.prefix) if calls.prefix else "",
            "inner",
            _lark_string(calls.suffix) if calls.suffix else "",
        )
        if p
    )
    if isinstance(choice, str) and choice == "auto":
        start = "start: TEXT? calls?" if calls.text_first else "start: TEXT | calls"
    else:
        start = {"none": "start: TEXT?", "required": "start: calls"}.get(
            choice if isinstance(choice, str) else "", "start: calls"
        )
    lines = [
        start,
        f"calls: {framed}",
        f"inner: {inner}",
        "call: " + " | ".join(f"call_{i}" for i in range(len(tools))),
        *rules,
    ]
    if "TEXT" in start:
        if calls.start or choice == "none":
            # Free text, except that it never contains what opens the calls.
            never = f" & ~/(?s:.*{_lark_regex_literal(calls.start.strip())}.*)/" if calls.start else ""
            lines.append(f"TEXT: /(?s:.+)/{never}")
        else:
            # The calls are the whole output and open with `{`: text must not.
            lines.append("TEXT: /(?s:[^{].*)/")
    return "\n".join(lines) + "\n"
