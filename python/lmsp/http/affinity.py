"""Which conversation a request continues, as an opaque key (http/forward.py routes by it): the
replica that served a conversation's last turn likely holds its prompt state in memory, so its
next turn is read there in a fraction of the time any other replica would take.

A key is a hash of its owner, its `cache_salt` and what stays the same from one turn of a
conversation to the next:

- a continuation of a stored response (`previous_response_id`, the Responses and LMSP faces):
  that id; the replica that produced the response publishes the same key (`response_key`);
- a message list, sent whole each turn (Chat Completions, Anthropic Messages, Ollama's chat,
  the Responses `input` as a list): the model, the system prompt or instructions,
  and the messages up to and including the first user message (the conversation's opening).

The owner is in every key, as it is in the prompt cache's scope: two owners' keys never match,
so no owner can learn from where its request was served that another sent the same prompt."""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from ..events.residency import KEY_CHARS

__all__ = ["affinity_key", "response_key"]


def _hash(kind: str, owner: str, salt: str | None, *parts: Any) -> str:
    raw = orjson.dumps([kind, owner, salt, *parts])
    return hashlib.blake2b(raw, digest_size=KEY_CHARS // 2).hexdigest()


def response_key(owner: str, response_id: str) -> str:
    """The key of a request continuing `response_id` (as the replica that produced it publishes it)."""
    return _hash("response", owner, None, response_id)


def _plain(content: Any) -> Any:
    """Content as it stays from turn to turn: Anthropic clients move `cache_control` marks to
    the latest message, so the opening carries one in turn 1 and none later."""
    if isinstance(content, list):
        return [{k: v for k, v in b.items() if k != "cache_control"} if isinstance(b, dict) else b for b in content]
    return content


def _opening(messages: list[Any]) -> list[Any] | None:
    """The messages up to the first user message, as (role, content) pairs: a Responses item's
    `type` and ids may be given or not from one turn to the next. None without a user message,
    or for a list that is not messages (an embeddings `input`)."""
    opening = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return None
        opening.append((message["role"], _plain(message.get("content"))))
        if message["role"] == "user":
            return opening
    return None


def affinity_key(body: dict[str, Any], owner: str) -> str | None:
    """The key of the conversation a request body continues; None when it names none (the
    request is then served wherever it lands)."""
    extensions = body.get("extensions")
    salt = body.get("cache_salt") or (extensions.get("cache_salt") if isinstance(extensions, dict) else None)
    salt = salt if isinstance(salt, str) else None
    previous = body.get("previous_response_id")
    if isinstance(previous, str):
        return response_key(owner, previous)
    model = body.get("model")
    # Not a Responses `input` given as one string: an embeddings `input` looks the same.
    messages = body.get("messages", body.get("input"))
    if not isinstance(model, str) or not isinstance(messages, list):
        return None
    opening = _opening(messages)
    if opening is None:
        return None
    system = _plain(body.get("system", body.get("instructions")))
    return _hash("opening", owner, salt, model, system, opening)
