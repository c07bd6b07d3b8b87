"""From an OpenAI Responses request to the plan the responses service runs, and the fields the
response object echoes back.

Each OpenAI field is honoured, refused (400, naming it, as OpenAI answers a value it does not
support), or accepted and left out; the comments say which and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic_core import SchemaValidator, ValidationError

from ...engine.sampling import DEFAULT_TEMPERATURE, Sampling
from ...engine.tools import NamedChoice, ToolChoice
from ...protocol.errors import ProblemError
from ...protocol.requests import check_tools, validate_response_request, validation_problem
from ...service.plan import GenerationPlan, JsonOutput, ToolUse
from ..reasoning import reasoning_of_request
from ..sampling import cache_salt_of, narrowing_of, sampling_of
from .objects import NAMESPACE_SEP
from .schema import DROPPED_TOOLS, RESPONSES_REQUEST

__all__ = ["Translated", "json_object_schema", "parts_text", "translate_input", "translate_response_request"]

_validator = SchemaValidator(RESPONSES_REQUEST)
_MEDIA = ("input_image", "input_file", "input_audio")
# Items a model here never makes, sent back by clients that keep their whole history (Codex):
# their content has no meaning to this model, and none of it is a turn it can read.
_DROPPED_ITEMS = ("reasoning", "local_shell_call", "local_shell_call_output", "web_search_call")


def json_object_schema() -> dict[str, Any]:
    """`json_object`: any JSON object, enforced like any schema."""
    return {"type": "object"}


@dataclass(frozen=True)
class Translated:
    plan: GenerationPlan
    echo: dict[str, Any]  # the request fields the response object carries back
    stream: bool
    background: bool


def _refuse(param: str, detail: str) -> ProblemError:
    return ProblemError("invalid_request", detail, param=param)


def parts_text(content: Any, param: str) -> str:
    """A message's text: a string, or its parts joined (media parts refused)."""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part["type"]
        if kind in _MEDIA or kind in ("image_url", "file"):
            raise ProblemError(
                "unsupported_content_type",
                f"content type {kind!r} is not supported; only text is",
                param=f"{param}[{j}].type",
            )
        texts.append(part.get("text", part.get("refusal", "")))
    return "".join(texts)


def _message(role: str, content: str) -> dict[str, Any]:
    kind = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "role": role, "content": [{"type": kind, "text": content}]}


def _summary(parts: Any) -> list[dict[str, str]]:
    """A reasoning item's summary_text parts (its encrypted content has no meaning here)."""
    if not isinstance(parts, list):
        return []
    return [
        {"type": "summary_text", "text": part["text"]}
        for part in parts
        if isinstance(part, dict) and part.get("type") == "summary_text" and isinstance(part.get("text"), str)
    ]


def translate_input(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI input items as LMSP items: `developer` is a system turn (the models here have no
    separate role for it)."""
    if isinstance(value, str):
        return [_message("user", value)]
    items: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        kind = item.get("type", "message")
        if kind == "reasoning":  # a thinking model's thinking, kept for its template (service/messages.py)
            items.append({"type": "reasoning", "summary": _summary(item.get("summary"))})
            continue
        if kind in _DROPPED_ITEMS:
            continue
        if kind == "message":
            role = "system" if item["role"] == "developer" else item["role"]
            items.append(_message(role, parts_text(item["content"], f"input[{i}].content")))
        elif kind == "function_call":
            items.append(
                {
                    "type": "function_call",
                    "call_id": item["call_id"],
                    "name": _qualified(item),
                    "arguments": item["arguments"],
                }
            )
        elif kind == "custom_tool_call":  # its input goes back in the custom frame it was written in
            items.append(
                {
                    "type": "custom_tool_call",
                    "call_id": item["call_id"],
                    "name": _qualified(item),
                    "input": item["input"],
                }
            )
        else:  # function_call_output, custom_tool_call_output: kept apart, for input_items
            output = item["output"]
            text = output if isinstance(output, str) else parts_text(output, f"input[{i}].output")
            items.append({"type": kind, "call_id": item["call_id"], "output": text})
    return items


def _tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for tool in tools:
        kind = tool["type"]
        if kind in DROPPED_TOOLS:
            continue  # hosted tools the service cannot run: the model is not told of them
        if kind == "namespace":
            out += [_tool(inner, f"{tool['name']}{NAMESPACE_SEP}{inner['name']}") for inner in tool["tools"]]
        else:
            out.append(_tool(tool, tool["name"]))
    return out


def _tool(tool: dict[str, Any], name: str) -> dict[str, Any]:
    if tool["type"] == "custom":
        # Carried as it is: the service enforces its grammar (engine/tools.py).
        lmsp = {"type": "custom", "name": name, "format": tool.get("format") or {"type": "text"}}
    else:
        # `strict` is honoured whatever it says: arguments are always decoded under the schema.
        lmsp = {"type": "function", "name": name}
        if tool.get("parameters") is not None:
            lmsp["parameters"] = tool["parameters"]
    if tool.get("description"):
        lmsp["description"] = tool["description"]
    return lmsp


def _qualified(item: dict[str, Any]) -> str:
    return f"{item['namespace']}{NAMESPACE_SEP}{item['name']}" if item.get("namespace") else item["name"]


def _lmsp_view(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan as the LMSP schema knows it, for its checks: custom calls stand in as function
    calls; the tools are checked apart (`check_tools`), their names being OpenAI's."""
    items = [_as_function(i) for i in plan["input"]] or [_message("user", "")]
    return {k: v for k, v in plan.items() if k not in ("tools", "tool_choice")} | {"input": items}


def _as_function(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "custom_tool_call":
        return {"type": "function_call", "call_id": item["call_id"], "name": item["name"], "arguments": item["input"]}
    if item["type"] == "custom_tool_call_output":
        return {**item, "type": "function_call_output"}
    return item


def _choice(choice: Any, tools: list[dict[str, Any]]) -> Any:
    """A named choice names a tool of its kind."""
    if not isinstance(choice, dict):
        return choice
    kinds = {t["name"]: t["type"] for t in tools}
    if choice["name"] in kinds and kinds[choice["name"]] != choice["type"]:
        raise _refuse(
            "tool_choice.type", f"tool {choice['name']!r} is a {kinds[choice['name']]} tool, not {choice['type']}"
        )
    return {"type": "function", "name": choice["name"]}


def _output(text: dict[str, Any] | None, extensions: dict[str, Any]) -> JsonOutput | None:
    form = (text or {}).get("format") or {"type": "text"}
    if form["type"] == "json_schema":
        return JsonOutput(form["name"], form["schema"], narrowing=narrowing_of(extensions))
    if form["type"] == "json_object":
        return JsonOutput("json_object", json_object_schema())
    return None


def _plan_choice(choice: Any) -> ToolChoice:
    return NamedChoice(choice["name"]) if isinstance(choice, dict) else choice


def _validated(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _refuse("", "the body must be a JSON object")
    try:
        request: dict[str, Any] = _validator.validate_python(body)
    except ValidationError as exc:
        raise validation_problem(exc, body) from None
    return request


def translate_response_request(body: Any, owner: str) -> Translated:
    req = _validated(body)
    # Refused: what would change the answer and cannot be done here.
    if req.get("truncation") == "auto":
        raise _refuse("truncation", "truncation 'auto' is not supported; an input over the window is refused instead")
    if req.get("top_logprobs"):
        raise _refuse("top_logprobs", "log probabilities are not supported")
    if req.get("max_tool_calls") is not None:
        raise _refuse("max_tool_calls", "max_tool_calls is not supported; parallel_tool_calls false makes one call")
    background = bool(req.get("background"))
    store = req.get("store")
    store = True if store is None else store  # OpenAI's default
    if background and not store:
        raise _refuse("background", "a background response must be stored (store: true)")
    tools = _tools(req.get("tools") or [])
    choice = _choice(req.get("tool_choice", "auto"), tools)
    parallel = req.get("parallel_tool_calls")
    parallel = True if parallel is None else parallel  # OpenAI's default
    # The request as LMSP states it, for the LMSP checks (unique tool names, a named choice
    # that exists) that hold for every plan.
    lmsp: dict[str, Any] = {"model": req["model"], "input": translate_input(req["input"])}
    if tools:
        lmsp["tools"] = tools
        lmsp["tool_choice"] = choice
    elif choice not in ("auto", "none"):
        raise _refuse("tool_choice", "tool_choice needs tools the service can run")
    for name in ("max_output_tokens", "temperature", "previous_response_id"):
        if req.get(name) is not None:
            lmsp[name] = req[name]
    output = _output(req.get("text"), req.get("extensions") or {})
    if not lmsp["input"] and not lmsp.get("previous_response_id"):
        raise _refuse("input", "the input has nothing the model can read")
    validate_response_request(_lmsp_view(lmsp))
    check_tools(lmsp)
    sampling = Sampling(
        temperature=req["temperature"] if req.get("temperature") is not None else DEFAULT_TEMPERATURE,
        top_p=req["top_p"] if req.get("top_p") is not None else 1.0,
    )
    plan = GenerationPlan(
        model=req["model"],
        input=tuple(lmsp["input"]),
        owner=owner,
        instructions=req.get("instructions") or None,
        sampling=sampling_of(sampling, req.get("extensions") or {}),
        max_output_tokens=req.get("max_output_tokens"),
        output=output,
        tools=ToolUse(tuple(tools), _plan_choice(choice), parallel) if tools else None,
        store=store,
        previous_response_id=req.get("previous_response_id"),
        stream=bool(req.get("stream")),
        reasoning=reasoning_of_request((req.get("reasoning") or {}).get("effort"), req.get("extensions") or {}),
        cache_salt=cache_salt_of(req.get("cache_salt"), "cache_salt"),
    )
    echo = {
        "instructions": req.get("instructions"),
        "max_output_tokens": req.get("max_output_tokens"),
        "metadata": req.get("metadata") or {},
        "parallel_tool_calls": parallel,
        "previous_response_id": req.get("previous_response_id"),
        "prompt_cache_key": req.get("prompt_cache_key"),
        "reasoning": {
            "effort": (req.get("reasoning") or {}).get("effort"),
            "summary": (req.get("reasoning") or {}).get("summary"),
        },
        "safety_identifier": req.get("safety_identifier"),
        "service_tier": "default",
        "store": store,
        "background": background,
        "temperature": req.get("temperature") if req.get("temperature") is not None else 1.0,
        "text": {"format": (req.get("text") or {}).get("format") or {"type": "text"}, "verbosity": "medium"},
        "tool_choice": req.get("tool_choice", "auto"),
        "tools": req.get("tools") or [],
        "top_p": req.get("top_p") if req.get("top_p") is not None else 1.0,
        "truncation": "disabled",
        "user": req.get("user"),
    }
    return Translated(plan, echo, plan.stream, background)
