"""Ollama's `/api/chat` and `/api/generate` requests as one plan (service/plan.py), checked once.

What maps: messages (system, user, assistant with `tool_calls`, `tool` results), `system` and
`prompt`, `format` (`"json"` or a JSON schema, held by the grammar), `tools`, `options`
(temperature, top_p, top_k, min_p, the penalties, seed, num_predict, stop; num_ctx is checked
but the window is the server's), `keep_alive` and `think`. What cannot be honoured is refused
by name (images, `raw`, `template`, `suffix`, a non-empty `context`), never silently dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, cast

import orjson

from ...engine.sampling import Sampling
from ...protocol.errors import ProblemError
from ...protocol.requests import validate_response_request
from ...service.plan import GenerationPlan, JsonOutput, NamedChoice, ReasoningControl, ToolChoice, ToolUse
from ..sampling import SAMPLING_EXTENSIONS

__all__ = ["OllamaRequest", "chat_request", "generate_request", "keep_alive_seconds"]

_JSON_ANY_OBJECT: dict[str, Any] = {"type": "object"}
# Options Ollama knows that change nothing here (the runner's own settings): accepted, as
# Ollama accepts them, and ignored.
_RUNNER_OPTIONS = frozenset(
    {
        "numa",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "embedding_only",
        "num_thread",
        "num_keep",
        "repeat_last_n",
        "tfs_z",
        "typical_p",
        "mirostat",
        "mirostat_tau",
        "mirostat_eta",
        "penalize_newline",
    }
)
_THINK_LEVELS = ("low", "medium", "high")
_DURATION = re.compile(r"(-?)((?:[0-9]+(?:\.[0-9]*)?(?:ns|us|µs|ms|s|m|h))+)")
_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?)(ns|us|µs|ms|s|m|h)")
_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class OllamaRequest:
    model: str
    # None: nothing to generate (no prompt, no messages): Ollama's way to load or unload.
    plan: GenerationPlan | None
    stream: bool
    # Seconds the model stays loaded after this request (negative: for ever); None: the
    # server's --keep-alive.
    keep_alive: float | None


def _refuse(param: str, detail: str) -> ProblemError:
    return ProblemError("invalid_request", detail, param=param)


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's `keep_alive`: seconds as a number, or a Go duration (`5m`, `1h30m`, `0`, `-1`)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise _refuse("keep_alive", "keep_alive is a number of seconds or a duration such as 5m")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        text = value.strip()
        try:
            return float(text)
        except ValueError:
            pass
        match = _DURATION.fullmatch(text)
        if match is not None:
            seconds = sum(float(n) * _UNIT[u] for n, u in _PART.findall(match[2]))
            return -seconds if match[1] else seconds
    raise _refuse("keep_alive", f"keep_alive is a number of seconds or a duration such as 5m, not {value!r}")


def _number(options: dict[str, Any], name: str, low: float, high: float, whole: bool) -> float | int | None:
    value = options.get(name)
    if value is None:
        return None
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if not is_number or (whole and value != int(value)) or not low <= value <= high:
        kind = "an integer" if whole else "a number"
        raise _refuse(f"options.{name}", f"options.{name} is {kind} from {low:g} to {high:g}")
    return int(value) if whole else float(value)


def _sampling(options: dict[str, Any]) -> Sampling:
    chosen: dict[str, Any] = {}
    temperature = _number(options, "temperature", 0.0, 2.0, False)
    if temperature is not None:
        chosen["temperature"] = temperature
    for name, (low, high, whole) in SAMPLING_EXTENSIONS.items():
        value = _number(options, name, low, high, whole)
        if value is not None:
            chosen[name] = value
    seed = options.get("seed")
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise _refuse("options.seed", "options.seed is an integer")
        chosen["seed"] = seed % 2**32 if seed >= 0 else -1  # Ollama's -1: a random seed
    return replace(Sampling(), **chosen)


def _options(body: dict[str, Any]) -> tuple[Sampling, int | None, tuple[str, ...]]:
    """Sampling, the output's token limit and the stop sequences from `options`."""
    options = body.get("options")
    if options is None:
        return Sampling(), None, ()
    if not isinstance(options, dict):
        raise _refuse("options", "options is an object")
    predict = _number(options, "num_predict", -2, 1_000_000, True)
    # -1 (no limit) and -2 (until the window is full) both mean no limit of their own here.
    limit = int(predict) if predict is not None and predict > 0 else None
    _number(options, "num_ctx", 1, 10_000_000, True)  # the window is the server's (--ctx)
    stop = options.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(s for s in stop if s)
    else:
        raise _refuse("options.stop", "options.stop is a list of strings")
    return _sampling(options), limit, stops


def _format(value: Any) -> JsonOutput | None:
    if value is None or value == "":
        return None
    if value == "json":
        return JsonOutput("json", _JSON_ANY_OBJECT)
    if isinstance(value, dict):
        return JsonOutput("format", value)
    raise _refuse("format", 'format is "json" or a JSON schema (an object)')


def _think(value: Any) -> ReasoningControl | None:
    if value is None:
        return None
    if value is True:
        return ReasoningControl()
    if value is False:
        return ReasoningControl("none")
    if value in _THINK_LEVELS:
        return ReasoningControl(value)
    raise _refuse("think", 'think is true, false, "low", "medium" or "high"')


def _tools(value: Any) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _refuse("tools", "tools is a list of functions")
    tools: list[dict[str, Any]] = []
    for i, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise _refuse(f"tools[{i}]", 'a tool is {"type": "function", "function": {"name": …, "parameters": …}}')
        shaped = {"type": "function", "name": function.get("name")}
        for name in ("description", "parameters"):
            if function.get(name) is not None:
                shaped[name] = function[name]
        tools.append(shaped)
    return tools


def _tool_choice(value: Any, tools: list[dict[str, Any]]) -> ToolChoice:
    """An lmsp extension (Ollama has no `tool_choice`): `auto` (Ollama's behaviour, and the
    default), `none`, `required`, or one tool by name, in OpenAI's shape."""
    if value is None:
        return "auto"
    if value in ("auto", "none", "required"):
        return cast(ToolChoice, value)
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or name not in {t["name"] for t in tools}:
        raise _refuse(
            "tool_choice",
            'tool_choice is "auto", "none", "required" or {"type": "function", "function": {"name": <a tool\'s name>}}',
        )
    return NamedChoice(name)


def _text(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if not isinstance(content, str):
        raise _refuse(f"messages[{i}].content", "content is a string")
    return content


def _no_images(value: dict[str, Any], param: str) -> None:
    if value.get("images"):
        raise ProblemError("unsupported_content_type", "images are not supported: send text only", param=param)


def _arguments(value: Any, param: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return orjson.dumps(value).decode()
    raise _refuse(param, "a tool call's arguments are an object")


def _items(messages: Any) -> list[dict[str, Any]]:
    """Ollama's messages as LMSP items. Ollama's calls carry no ids (newer ones may): each
    gets one, and a `tool` result answers the oldest open call of its `tool_name` (or the
    oldest open call)."""
    if not isinstance(messages, list):
        raise _refuse("messages", "messages is a list")
    items: list[dict[str, Any]] = []
    open_calls: list[tuple[str, str]] = []  # (call id, name), oldest first
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _refuse(f"messages[{i}]", "a message is an object")
        role = message.get("role")
        text = _text(message, i)
        _no_images(message, f"messages[{i}].images")
        if role == "tool":
            name = message.get("tool_name") or message.get("name")
            match = next((c for c in open_calls if c[1] == name), open_calls[0] if open_calls else None)
            if match is None:
                raise _refuse(f"messages[{i}]", "a tool message answers a tool call of an earlier assistant message")
            open_calls.remove(match)
            items.append({"type": "function_call_output", "call_id": match[0], "output": text})
        elif role == "assistant":
            if text:
                items.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
                )
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise _refuse(f"messages[{i}].tool_calls", "tool_calls is a list")
            for k, call in enumerate(calls):
                param = f"messages[{i}].tool_calls[{k}]"
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise _refuse(param, 'a tool call is {"function": {"name": …, "arguments": {…}}}')
                call_id = call.get("id") if isinstance(call.get("id"), str) and call["id"] else f"call_{i}_{k}"
                arguments = _arguments(function.get("arguments", {}), f"{param}.function.arguments")
                items.append(
                    {"type": "function_call", "call_id": call_id, "name": function["name"], "arguments": arguments}
                )
                open_calls.append((call_id, function["name"]))
        elif role in ("user", "system"):
            items.append({"type": "message", "role": role, "content": [{"type": "input_text", "text": text}]})
        else:
            raise _refuse(f"messages[{i}].role", "role is system, user, assistant or tool")
    return items


def _common(body: Any) -> tuple[dict[str, Any], str, bool, float | None]:
    if not isinstance(body, dict):
        raise _refuse("", "the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _refuse("model", "model is required")
    stream = body.get("stream", True)  # Ollama streams unless told not to
    if not isinstance(stream, bool):
        raise _refuse("stream", "stream is true or false")
    return body, model, stream, keep_alive_seconds(body.get("keep_alive"))


def _plan(
    body: dict[str, Any],
    model: str,
    owner: str,
    stream: bool,
    items: list[dict[str, Any]],
    instructions: str | None,
    tools: list[dict[str, Any]],
) -> GenerationPlan:
    # The request as LMSP states it, for the checks every face's plan gets.
    lmsp: dict[str, Any] = {"model": model, "input": items}
    if tools:
        lmsp["tools"] = tools
    validate_response_request(lmsp)
    sampling, limit, stop = _options(body)
    return GenerationPlan(
        model=model,
        input=tuple(items),
        owner=owner,
        instructions=instructions,
        sampling=sampling,
        max_output_tokens=limit,
        stop=stop,
        output=_format(body.get("format")),
        # Ollama lets the model choose, and may return several calls at once.
        tools=ToolUse(tuple(tools), _tool_choice(body.get("tool_choice"), tools), parallel=True) if tools else None,
        stream=stream,
        reasoning=_think(body.get("think")),
    )


def chat_request(body: Any, owner: str) -> OllamaRequest:
    body, model, stream, keep_alive = _common(body)
    messages = body.get("messages")
    if not messages:  # Ollama loads (or, with keep_alive 0, unloads) the model and says so
        return OllamaRequest(model, None, stream, keep_alive)
    items = _items(messages)
    tools = _tools(body.get("tools"))
    return OllamaRequest(model, _plan(body, model, owner, stream, items, None, tools), stream, keep_alive)


def generate_request(body: Any, owner: str) -> OllamaRequest:
    body, model, stream, keep_alive = _common(body)
    for name in ("raw", "template", "suffix"):
        if body.get(name):
            raise _refuse(name, f"{name} is not supported: the prompt always goes through the model's chat template")
    if body.get("context"):
        raise _refuse("context", "context (the deprecated token history) is not supported: send messages to /api/chat")
    _no_images(body, "images")
    prompt = body.get("prompt")
    system = body.get("system")
    if prompt is not None and not isinstance(prompt, str):
        raise _refuse("prompt", "prompt is a string")
    if system is not None and not isinstance(system, str):
        raise _refuse("system", "system is a string")
    if not prompt:
        return OllamaRequest(model, None, stream, keep_alive)
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": prompt}]}]
    return OllamaRequest(model, _plan(body, model, owner, stream, items, system or None, []), stream, keep_alive)
