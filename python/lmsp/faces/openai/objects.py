"""LMSP objects as the OpenAI API shapes them: the response object, its output items and
usage, models. Item ids and call ids pass through unchanged (the builder made them once)."""

from __future__ import annotations

from typing import Any

__all__ = ["NAMESPACE_SEP", "model_object", "output_item", "response_object", "usage_object"]


def usage_object(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    return {
        "input_tokens": usage["input_tokens"],
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": usage["output_tokens"],
        "output_tokens_details": {
            "reasoning_tokens": (usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0)
        },
        "total_tokens": usage["total_tokens"],
    }


def output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


# A namespace tool's functions are named `namespace.name` to the model (OpenAI's function
# names cannot hold a dot, so the name says which it is).
NAMESPACE_SEP = "."


def output_item(item: dict[str, Any]) -> dict[str, Any]:
    if item["type"] == "message":
        content = [output_text(part["text"]) for part in item["content"]]
        return {**item, "content": content}
    if item["type"] == "reasoning":  # OpenAI's shape: the summary, and no content of its own
        return {**item, "content": [], "encrypted_content": None, "status": "completed"}
    if item["type"] in ("function_call", "custom_tool_call") and NAMESPACE_SEP in item["name"]:
        namespace, name = item["name"].split(NAMESPACE_SEP, 1)
        return {**item, "namespace": namespace, "name": name}
    return dict(item)


def _error(error: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if error is None else {"code": error["code"], "message": error["detail"]}


# What a response object echoes when its request is not known (one read back from the store).
DEFAULT_ECHO: dict[str, Any] = {
    "background": False,
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "previous_response_id": None,
    "prompt_cache_key": None,
    "reasoning": {"effort": None, "summary": None},
    "safety_identifier": None,
    "service_tier": "default",
    "store": True,
    "temperature": 1.0,
    "text": {"format": {"type": "text"}, "verbosity": "medium"},
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "truncation": "disabled",
    "user": None,
}


def response_object(response: dict[str, Any], echo: dict[str, Any] | None = None) -> dict[str, Any]:
    """An LMSP response object as OpenAI's."""
    return {
        "id": response["id"],
        "object": "response",
        "created_at": response["created_at"],
        "status": response["status"],
        "error": _error(response["error"]),
        "incomplete_details": response["incomplete_details"],
        "model": response["model"],
        "output": [output_item(item) for item in response["output"]],
        "usage": usage_object(response["usage"]),
        "max_tool_calls": None,
        "top_logprobs": 0,
        **(echo or DEFAULT_ECHO),
    }


def model_object(described: dict[str, Any]) -> dict[str, Any]:
    return {"id": described["id"], "object": "model", "created": 0, "owned_by": "lmsp"}
