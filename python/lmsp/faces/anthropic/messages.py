"""LMSP responses as Anthropic messages: the final response as a `message` object, its events
as the Messages stream (`message_start`, `content_block_start`/`_delta`/`_stop`,
`message_delta`, `message_stop`, `ping`), in the order and shapes the anthropic SDK's
accumulator reads.

Each output item is one content block: a message's text a `text` block, a function call a
`tool_use` block whose `input` streams as `input_json_delta`s, a reasoning item a `thinking`
block (only when the request asked to see thinking). A stream has one reader, the POST's, and
is never resumed, so its events are projected from the LMSP events as that reader copies
them out (as the Chat Completions chunks are).
"""

from __future__ import annotations

from typing import Any

import orjson

from lmsp._core import encode_frame

from ...protocol import events as ev
from .errors import error_object

__all__ = ["MessageEvents", "message_id", "message_object"]

PING = encode_frame(None, "ping", b'{"type":"ping"}')


def message_id(response_id: str) -> str:
    return "msg_" + response_id.removeprefix("resp_")


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic counts prompt tokens read from its cache apart from `input_tokens`; here the
    KV cells reused from an earlier request are those."""
    usage = usage or {"input_tokens": 0, "output_tokens": 0}
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": usage["input_tokens"] - cached,
        "output_tokens": usage["output_tokens"],
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }


def _input(arguments: str) -> Any:
    """A call's arguments as the `input` object (a cut call's unfinished JSON: empty)."""
    try:
        value = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _thinking_text(item: dict[str, Any]) -> str:
    parts = item.get("content") or item.get("summary") or []
    return "".join(part.get("text", "") for part in parts if isinstance(part, dict))


def _block(item: dict[str, Any], thinking: bool) -> dict[str, Any] | None:
    kind = item["type"]
    if kind == "message":
        return {"type": "text", "text": "".join(part["text"] for part in item["content"]), "citations": None}
    if kind == "function_call":
        return {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": _input(item["arguments"])}
    if kind == "reasoning" and thinking:
        return {"type": "thinking", "thinking": _thinking_text(item), "signature": ""}
    return None


def _stop_reason(status: str, reason: str | None, called: bool) -> str:
    if status == "incomplete":
        return "model_context_window_exceeded" if reason == "context_length" else "max_tokens"
    # A stop sequence ends the output as the model's own end does; the service does not say
    # which one it was, so both are `end_turn`.
    return "tool_use" if called else "end_turn"


def message_object(response: dict[str, Any], thinking: bool = False) -> dict[str, Any]:
    """A final LMSP response (completed or incomplete) as an Anthropic `message`."""
    content = [block for item in response["output"] if (block := _block(item, thinking)) is not None]
    reason = (response.get("incomplete_details") or {}).get("reason")
    called = any(block["type"] == "tool_use" for block in content)
    return {
        "id": message_id(response["id"]),
        "type": "message",
        "role": "assistant",
        "model": response["model"],
        "content": content,
        "stop_reason": _stop_reason(response["status"], reason, called),
        "stop_sequence": None,
        "usage": _usage(response.get("usage")),
    }


def _frame(name: str, body: dict[str, Any]) -> bytes:
    return encode_frame(None, name, orjson.dumps({"type": name, **body}))


class MessageEvents:
    """Turns one run's LMSP events, read in order, into the bytes of its Messages stream."""

    def __init__(self, response_id: str, model: str, thinking: bool) -> None:
        self._id = message_id(response_id)
        self._model = model
        self._thinking = thinking
        self._blocks: dict[str, int] = {}  # item id → content block index
        self._kinds: dict[str, str] = {}  # item id → block type
        self._fed: set[str] = set()  # thinking blocks that got deltas
        self._called = False

    def frames(self, name: str, data: bytes) -> bytes:
        if name == ev.TEXT_DELTA:
            body = orjson.loads(data)
            index = self._blocks.get(body["item_id"])
            if index is None:
                return b""
            delta = {"type": "text_delta", "text": body["delta"]}
            return _frame("content_block_delta", {"index": index, "delta": delta})
        if name == ev.ARGUMENTS_DELTA:
            body = orjson.loads(data)
            delta = {"type": "input_json_delta", "partial_json": body["delta"]}
            return _frame("content_block_delta", {"index": self._blocks[body["item_id"]], "delta": delta})
        if name == ev.CREATED:
            return self._start() + PING
        if name == ev.ITEM_ADDED:
            return self._block_start(orjson.loads(data)["item"])
        if name == ev.ITEM_DONE:
            return self._block_stop(orjson.loads(data)["item"])
        if name in (ev.COMPLETED, ev.INCOMPLETE):
            body = orjson.loads(data)
            reason = (body.get("incomplete_details") or {}).get("reason")
            delta = {"stop_reason": _stop_reason(body["status"], reason, self._called), "stop_sequence": None}
            return _frame("message_delta", {"delta": delta, "usage": _usage(body.get("usage"))}) + _frame(
                "message_stop", {}
            )
        if name in (ev.FAILED, ev.ERROR, ev.CANCELLED):
            body = orjson.loads(data)
            problem = body.get("error") or {
                "code": "generation_failed",
                "detail": "the response was cancelled",
                "status": 500,
            }
            return encode_frame(None, "error", orjson.dumps(error_object(problem)))
        return self._thinking_delta(name, data)

    def _start(self) -> bytes:
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            # Counted once the prompt is read: message_delta carries them (as totals).
            "usage": _usage(None),
        }
        return _frame("message_start", {"message": message})

    def _block_start(self, item: dict[str, Any]) -> bytes:
        kind = item["type"]
        if kind == "message":
            block: dict[str, Any] = {"type": "text", "text": "", "citations": None}
        elif kind == "function_call":
            block = {"type": "tool_use", "id": item["call_id"], "name": item["name"], "input": {}}
            self._called = True
        elif kind == "reasoning" and self._thinking:
            block = {"type": "thinking", "thinking": "", "signature": ""}
        else:
            return b""
        index = self._blocks[item["id"]] = len(self._blocks)
        self._kinds[item["id"]] = block["type"]
        return _frame("content_block_start", {"index": index, "content_block": block})

    def _thinking_delta(self, name: str, data: bytes) -> bytes:
        """A reasoning item's text deltas, whatever the event calls them, as `thinking_delta`s."""
        if not name.endswith(".delta"):
            return b""
        body = orjson.loads(data)
        item_id = body.get("item_id") if isinstance(body, dict) else None
        if item_id is None or self._kinds.get(item_id) != "thinking" or not isinstance(body.get("delta"), str):
            return b""
        self._fed.add(item_id)
        delta = {"type": "thinking_delta", "thinking": body["delta"]}
        return _frame("content_block_delta", {"index": self._blocks[item_id], "delta": delta})

    def _block_stop(self, item: dict[str, Any]) -> bytes:
        index = self._blocks.get(item["id"])
        if index is None:
            return b""
        out = b""
        if self._kinds[item["id"]] == "thinking" and item["id"] not in self._fed:
            # Its text came whole with the item: sent as one delta.
            delta = {"type": "thinking_delta", "thinking": _thinking_text(item)}
            out = _frame("content_block_delta", {"index": index, "delta": delta})
        return out + _frame("content_block_stop", {"index": index})
