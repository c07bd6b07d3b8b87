"""From an Anthropic Messages request to the plan the responses service runs.

Each field is honoured, refused (400, naming it, as Anthropic answers a value it cannot take),
or accepted and left out; the comments say which and why. Blocks become LMSP items: `text`
a message, `tool_use` a function call, `tool_result` its output; an earlier turn's thinking is
dropped, as Anthropic drops it from the prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson
from pydantic_core import SchemaValidator, ValidationError

from ...engine.sampling import DEFAULT_TEMPERATURE, Sampling
from ...engine.tools import NamedChoice, ToolChoice
from ...protocol.errors import ProblemError
from ...protocol.requests import validate_response_request, validation_problem
from ...service.plan import GenerationPlan, JsonOutput, ReasoningControl, ReasoningEffort, ToolUse
from .schema import COUNT_TOKENS_REQUEST, MESSAGES_REQUEST

__all__ = ["MessagesRequest", "translate_count_tokens", "translate_messages"]

_messages = SchemaValidator(MESSAGES_REQUEST)
_count_tokens = SchemaValidator(COUNT_TOKENS_REQUEST)
_DROPPED_BLOCKS = ("thinking", "redacted_thinking")
_MEDIA = ("image", "document")
# `output_config.effort` as the plan's effort: Anthropic's two highest are the plan's highest.
_EFFORTS: dict[str, ReasoningEffort] = {
    "low": "low",
    "medium": "medium",
    "high": "high",
    "xhigh": "high",
    "max": "high",
}


@dataclass(frozen=True)
class MessagesRequest:
    plan: GenerationPlan
    # The client asked to see thinking (`thinking.type` enabled or adaptive, not omitted).
    thinking: bool = False

    @property
    def stream(self) -> bool:
        return self.plan.stream


def _refuse(param: str, detail: str) -> ProblemError:
    return ProblemError("invalid_request", detail, param=param)


def _validated(validator: SchemaValidator, body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _refuse("", "the body must be a JSON object")
    try:
        request: dict[str, Any] = validator.validate_python(body)
    except ValidationError as exc:
        raise validation_problem(exc, body) from None
    return request


def _text_of(blocks: Any, param: str) -> str:
    """A string, or text blocks joined (a tool result's content, the system prompt)."""
    if isinstance(blocks, str):
        return blocks
    texts = []
    for j, block in enumerate(blocks):
        if block["type"] != "text":
            raise ProblemError(
                "unsupported_content_type",
                f"content type {block['type']!r} is not supported; only text is",
                param=f"{param}[{j}].type",
            )
        texts.append(block["text"])
    return "\n".join(texts)


def _message(role: str, text: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": text}]}


def _block_item(role: str, block: dict[str, Any], param: str) -> dict[str, Any]:
    """A `tool_use` or `tool_result` block as its LMSP item."""
    kind = block["type"]
    if (kind == "tool_use") != (role == "assistant"):
        where = "an assistant" if kind == "tool_use" else "a user"
        raise _refuse(f"{param}.type", f"a {kind} block belongs in {where} message")
    if kind == "tool_use":
        arguments = orjson.dumps(block["input"]).decode()
        return {"type": "function_call", "call_id": block["id"], "name": block["name"], "arguments": arguments}
    output = _text_of(block.get("content", ""), f"{param}.content")
    if block.get("is_error"):
        output = f"Error: {output}"
    return {"type": "function_call_output", "call_id": block["tool_use_id"], "output": output}


def _items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message["role"]
        content = message["content"]
        if isinstance(content, str):
            items.append(_message(role, content))
            continue
        texts: list[str] = []  # consecutive text blocks are one message
        for j, block in enumerate(content):
            kind = block["type"]
            param = f"messages[{i}].content[{j}]"
            if kind in _DROPPED_BLOCKS:
                continue
            if kind in _MEDIA:
                raise ProblemError(
                    "unsupported_content_type", f"content type {kind!r} is not supported; only text is", param=param
                )
            if kind == "text":
                texts.append(block["text"])
                continue
            if texts:
                items.append(_message(role, "".join(texts)))
                texts = []
            items.append(_block_item(role, block, param))
        if texts:
            items.append(_message(role, "".join(texts)))
    return items


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        if tool.get("type") not in (None, "custom"):
            raise _refuse(
                f"tools[{i}].type",
                f"tool type {tool['type']!r} is a server tool, which this service cannot run; declare a custom tool",
            )
        lmsp = {"type": "function", "name": tool["name"], "parameters": tool["input_schema"]}
        if tool.get("description"):
            lmsp["description"] = tool["description"]
        out.append(lmsp)
    return out


def _choice(choice: dict[str, Any]) -> ToolChoice:
    kind = choice["type"]
    if kind == "tool":
        return NamedChoice(choice["name"])
    return {"auto": "auto", "any": "required", "none": "none"}[kind]  # type: ignore[return-value]


def _plan(req: dict[str, Any], owner: str, *, max_tokens: int | None) -> GenerationPlan:
    messages = req["messages"]
    if not messages:
        raise _refuse("messages", "messages: at least one message is required")
    if messages[-1]["role"] == "assistant":
        # A prefill continues the assistant's turn in place; the chat templates here always
        # close a turn, so the model would answer a new one instead of continuing it.
        raise _refuse("messages", "a final assistant message (prefill) is not supported; end with a user message")
    tools = _tools(req.get("tools") or [])
    choice_param = req.get("tool_choice") or {"type": "auto"}
    choice = _choice(choice_param)
    lmsp: dict[str, Any] = {"model": req["model"], "input": _items(messages)}
    if tools:
        lmsp["tools"] = tools
        lmsp["tool_choice"] = {"type": "function", "name": choice.name} if isinstance(choice, NamedChoice) else choice
    elif choice not in ("auto", "none"):
        raise _refuse("tool_choice", "tool_choice needs tools")
    if not lmsp["input"]:
        raise _refuse("messages", "the messages have nothing the model can read")
    # The LMSP checks that hold for every plan: items well-formed, unique tool names, a named
    # choice that exists.
    validate_response_request(lmsp)
    system = req.get("system")
    instructions = _text_of(system, "system") if system is not None else None
    form = (req.get("output_config") or {}).get("format")
    sampling = Sampling(
        temperature=req["temperature"] if req.get("temperature") is not None else DEFAULT_TEMPERATURE,
        top_p=req.get("top_p", 1.0),
        top_k=req.get("top_k", 0),
    )
    return GenerationPlan(
        model=req["model"],
        input=tuple(lmsp["input"]),
        owner=owner,
        instructions=instructions or None,
        sampling=sampling,
        max_output_tokens=max_tokens,
        stop=tuple(s for s in req.get("stop_sequences") or () if s),
        output=JsonOutput("output", form["schema"]) if form else None,
        tools=ToolUse(tuple(tools), choice, parallel=not choice_param.get("disable_parallel_tool_use", False))
        if tools
        else None,
        stream=bool(req.get("stream")),
    )


def _reasoning(req: dict[str, Any], max_tokens: int | None) -> ReasoningControl:
    """Anthropic's `thinking` as the plan's reasoning. No `thinking` is no thinking, as on
    Anthropic; `enabled` thinks within its budget, `adaptive` at the effort asked for."""
    thinking = req.get("thinking") or {"type": "disabled"}
    if thinking["type"] == "disabled":
        return ReasoningControl(effort="none")
    effort = _EFFORTS.get((req.get("output_config") or {}).get("effort") or "medium", "medium")
    if thinking["type"] == "adaptive":
        return ReasoningControl(effort=effort)
    budget = thinking["budget_tokens"]
    if max_tokens is not None and budget >= max_tokens:
        raise _refuse("thinking.budget_tokens", "thinking.budget_tokens must be less than max_tokens")
    return ReasoningControl(effort=effort, budget_tokens=budget)


def translate_messages(body: Any, owner: str) -> MessagesRequest:
    req = _validated(_messages, body)
    reasoning = _reasoning(req, req["max_tokens"])
    plan = replace(_plan(req, owner, max_tokens=req["max_tokens"]), reasoning=reasoning)
    shown = reasoning.effort != "none" and (req.get("thinking") or {}).get("display") != "omitted"
    return MessagesRequest(plan, shown)


def translate_count_tokens(body: Any, owner: str) -> GenerationPlan:
    req = _validated(_count_tokens, body)
    return replace(_plan(req, owner, max_tokens=None), reasoning=_reasoning(req, None))
