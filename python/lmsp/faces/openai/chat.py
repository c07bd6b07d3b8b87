"""Chat Completions (`POST /v1/chat/completions`) over the responses service: the request as a
plan, the final response as a `chat.completion`, its events as `chat.completion.chunk`s.

A chat stream has one reader, the POST's, and is never resumed, so its chunks are projected
from the LMSP events as that reader copies them out, rather than framed into a log of their own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import orjson
from pydantic_core import SchemaValidator, ValidationError

from lmsp._core import encode_frame

from ...engine.sampling import Sampling
from ...engine.tools import NamedChoice
from ...protocol import events as ev
from ...protocol.errors import ProblemError
from ...protocol.requests import validate_response_request, validation_problem
from ...service.plan import GenerationPlan, JsonOutput, ToolUse
from ..reasoning import reasoning_of
from .errors import error_object
from .objects import usage_object
from .schema import CHAT_REQUEST
from .translate import json_object_schema, parts_text

__all__ = ["ChatChunks", "ChatRequest", "completion_object", "translate_chat_request"]

_validator = SchemaValidator(CHAT_REQUEST)
DONE = encode_frame(None, None, b"[DONE]")
# The sampling controls a request may set: Chat Completions' own names, and llama-server's.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty")


@dataclass(frozen=True)
class ChatRequest:
    plan: GenerationPlan
    include_usage: bool

    @property
    def stream(self) -> bool:
        return self.plan.stream


def _refuse(param: str, detail: str) -> ProblemError:
    return ProblemError("invalid_request", detail, param=param)


def _items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        role = message["role"]
        content = message.get("content")
        text = "" if content is None else parts_text(content, f"messages[{i}].content")
        if role == "tool":
            items.append({"type": "function_call_output", "call_id": message["tool_call_id"], "output": text})
            continue
        if role == "assistant":
            if text:
                items.append(
                    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
                )
            for call in message.get("tool_calls") or []:
                function = call["function"]
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call["id"],
                        "name": function["name"],
                        "arguments": function["arguments"],
                    }
                )
            continue
        # `developer` is a system turn: the models here have no separate role for it.
        kind = "input_text"
        items.append(
            {
                "type": "message",
                "role": "user" if role == "user" else "system",
                "content": [{"type": kind, "text": text}],
            }
        )
    return items


def _tool(function: dict[str, Any]) -> dict[str, Any]:
    tool = {"type": "function", "name": function["name"]}
    for name in ("description", "parameters"):
        if function.get(name) is not None:
            tool[name] = function[name]
    return tool


def _output(form: dict[str, Any] | None) -> JsonOutput | None:
    if form is None or form["type"] == "text":
        return None
    if form["type"] == "json_object":
        return JsonOutput("json_object", json_object_schema())
    spec = form["json_schema"]
    return JsonOutput(spec["name"], spec.get("schema") or json_object_schema())


def _sampling(req: dict[str, Any]) -> Sampling:
    chosen = {name: req[name] for name in _SAMPLING if req.get(name) is not None}
    if req.get("seed") is not None:
        chosen["seed"] = req["seed"] % 2**32  # any integer, as OpenAI takes it
    return replace(Sampling(), **chosen)


def translate_chat_request(body: Any, owner: str) -> ChatRequest:
    if not isinstance(body, dict):
        raise _refuse("", "the body must be a JSON object")
    try:
        req: dict[str, Any] = _validator.validate_python(body)
    except ValidationError as exc:
        raise validation_problem(exc, body) from None
    # Refused: what would change the answer and cannot be done here.
    if (req.get("n") or 1) > 1:
        raise _refuse("n", "n > 1 is not supported: ask once per choice")
    if req.get("logprobs") or req.get("top_logprobs"):
        raise _refuse("logprobs", "log probabilities are not supported")
    if req.get("logit_bias"):
        raise _refuse("logit_bias", "logit_bias is not supported")
    if "audio" in (req.get("modalities") or []):
        raise _refuse("modalities", "only text output is supported")
    # The request as LMSP states it, for the LMSP checks that hold for every plan.
    lmsp: dict[str, Any] = {"model": req["model"], "input": _items(req["messages"])}
    tools = [_tool(t["function"]) for t in req.get("tools") or []]
    choice = req.get("tool_choice", "auto")
    if tools:
        lmsp["tools"] = tools
        lmsp["tool_choice"] = (
            {"type": "function", "name": choice["function"]["name"]} if isinstance(choice, dict) else choice
        )
    elif choice not in ("auto", "none"):
        raise _refuse("tool_choice", "tool_choice needs tools")
    if not lmsp["input"]:
        raise _refuse("messages", "the messages have nothing the model can read")
    validate_response_request(lmsp)
    parallel = req.get("parallel_tool_calls")
    named = lmsp.get("tool_choice")
    stop = req.get("stop")
    plan = GenerationPlan(
        model=req["model"],
        input=tuple(lmsp["input"]),
        owner=owner,
        sampling=_sampling(req),
        max_output_tokens=req.get("max_completion_tokens") or req.get("max_tokens"),
        stop=(stop,) if isinstance(stop, str) else tuple(stop or ()),
        output=_output(req.get("response_format")),
        tools=ToolUse(
            tuple(tools),
            NamedChoice(named["name"]) if isinstance(named, dict) else choice,
            parallel=True if parallel is None else parallel,
        )
        if tools
        else None,
        stream=bool(req.get("stream")),
        reasoning=reasoning_of(req.get("reasoning_effort"), req.get("reasoning_budget")),
        cache_salt=req.get("cache_salt"),  # checked by its schema
    )
    include_usage = bool((req.get("stream_options") or {}).get("include_usage"))
    return ChatRequest(plan, include_usage)


def completion_id(response_id: str) -> str:
    return "chatcmpl-" + response_id.removeprefix("resp_")


def _finish_reason(response: dict[str, Any]) -> str:
    if response["status"] == "incomplete":
        return "length"
    return "tool_calls" if any(item["type"] == "function_call" for item in response["output"]) else "stop"


def _chat_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    shaped = usage_object(usage)
    if shaped is None:
        return None
    return {
        "prompt_tokens": shaped["input_tokens"],
        "completion_tokens": shaped["output_tokens"],
        "total_tokens": shaped["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": shaped["input_tokens_details"]["cached_tokens"]},
        "completion_tokens_details": {"reasoning_tokens": shaped["output_tokens_details"]["reasoning_tokens"]},
    }


def completion_object(response: dict[str, Any]) -> dict[str, Any]:
    """A final LMSP response (completed or incomplete) as a `chat.completion`."""
    text = "".join(part["text"] for item in response["output"] if item["type"] == "message" for part in item["content"])
    calls = [
        {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
        for item in response["output"]
        if item["type"] == "function_call"
    ]
    message: dict[str, Any] = {"role": "assistant", "content": text or None, "refusal": None, "annotations": []}
    thinking = "".join(
        part["text"] for item in response["output"] if item["type"] == "reasoning" for part in item["summary"]
    )
    if thinking:  # as llama-server and vLLM send it
        message["reasoning_content"] = thinking
    if calls:
        message["tool_calls"] = calls
    return {
        "id": completion_id(response["id"]),
        "object": "chat.completion",
        "created": response["created_at"],
        "model": response["model"],
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(response), "logprobs": None}],
        "usage": _chat_usage(response["usage"]),
        "service_tier": "default",
        "system_fingerprint": None,
    }


class ChatChunks:
    """Turns one run's LMSP events, read in order, into the bytes of its chunk stream."""

    def __init__(self, response_id: str, model: str, created: int, include_usage: bool) -> None:
        self._base = {
            "id": completion_id(response_id),
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage
        self._calls: dict[str, int] = {}  # item id → tool_calls index
        self._any_call = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        body = {**self._base, "choices": [choice], **extra}
        if self._include_usage and "usage" not in body:
            body["usage"] = None
        return encode_frame(None, None, orjson.dumps(body))

    def frames(self, name: str, data: bytes) -> bytes:
        if name == ev.TEXT_DELTA:
            return self._chunk({"content": orjson.loads(data)["delta"]})
        if name == ev.REASONING_DELTA:  # as llama-server and vLLM stream a thinking model's thinking
            return self._chunk({"reasoning_content": orjson.loads(data)["delta"]})
        if name == ev.CREATED:
            return self._chunk({"role": "assistant", "content": "", "refusal": None})
        if name == ev.ITEM_ADDED:
            item = orjson.loads(data)["item"]
            if item["type"] != "function_call":
                return b""
            index = self._calls[item["id"]] = len(self._calls)
            self._any_call = True
            call = {
                "index": index,
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": ""},
            }
            return self._chunk({"tool_calls": [call]})
        if name == ev.ARGUMENTS_DELTA:
            body = orjson.loads(data)
            return self._chunk(
                {"tool_calls": [{"index": self._calls[body["item_id"]], "function": {"arguments": body["delta"]}}]}
            )
        if name in (ev.COMPLETED, ev.INCOMPLETE):
            body = orjson.loads(data)
            finish = "length" if name == ev.INCOMPLETE else "tool_calls" if self._any_call else "stop"
            out = self._chunk({}, finish)
            if self._include_usage:
                out += encode_frame(
                    None, None, orjson.dumps({**self._base, "choices": [], "usage": _chat_usage(body["usage"])})
                )
            return out + DONE
        if name in (ev.FAILED, ev.ERROR, ev.CANCELLED):
            body = orjson.loads(data)
            problem = body.get("error") or {
                "code": "generation_failed",
                "detail": "the response was cancelled",
                "status": 500,
            }
            return encode_frame(None, None, orjson.dumps(error_object(problem)))
        return b""  # item done: the deltas said it all
