"""A request's conversation key (http/affinity.py): the same across the turns of one
conversation on every face's shape, different for another owner, salt, model or opening, and
none for a body that continues no conversation. Routing by it: tests/unit/http/test_forward.py
and, through real replicas, tests/e2e/test_routing_affinity.py."""

from __future__ import annotations

from typing import Any

import pytest

from lmsp.events.residency import KEY_CHARS
from lmsp.http.affinity import affinity_key, response_key

ALICE, BOB = "token:alice", "token:bob"


def _turns(opening: list[dict[str, Any]], **fields: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Turn 1 and turn 3 of a conversation whose client sends the whole history each turn."""
    later = [
        *opening,
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And Italy's?"},
        {"role": "assistant", "content": "Rome."},
        {"role": "user", "content": "And Spain's?"},
    ]
    return {"model": "smol", "messages": opening, **fields}, {"model": "smol", "messages": later, **fields}


CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "France's capital?"}]


@pytest.mark.parametrize(
    ("first", "later"),
    [
        _turns(CHAT),  # Chat Completions, Ollama's chat
        _turns([{"role": "user", "content": "France's capital?"}], system="Be brief."),  # Anthropic
    ],
)
def test_every_turn_of_a_message_list_conversation_has_its_first_turns_key(
    first: dict[str, Any], later: dict[str, Any]
) -> None:
    key = affinity_key(first, ALICE)
    assert key is not None and len(key) == KEY_CHARS
    assert affinity_key(later, ALICE) == key


def test_cache_marks_moved_on_by_an_anthropic_client_leave_the_key_as_it_was() -> None:
    def text(value: str, marked: bool) -> list[dict[str, Any]]:
        return [{"type": "text", "text": value, **({"cache_control": {"type": "ephemeral"}} if marked else {})}]

    first = {
        "model": "smol",
        "system": text("Be brief.", True),
        "messages": [{"role": "user", "content": text("Hi", True)}],
    }
    later = {
        "model": "smol",
        "system": text("Be brief.", True),
        "messages": [
            {"role": "user", "content": text("Hi", False)},
            {"role": "assistant", "content": text("Hello.", False)},
            {"role": "user", "content": text("France?", True)},
        ],
    }
    assert affinity_key(first, ALICE) == affinity_key(later, ALICE) is not None


def test_a_responses_input_list_keys_on_its_opening_whatever_the_items_ids() -> None:
    first = {"model": "smol", "instructions": "Be brief.", "input": [{"role": "user", "content": "France?"}]}
    later = {
        "model": "smol",
        "instructions": "Be brief.",
        "input": [
            {"type": "message", "role": "user", "content": "France?"},
            {"type": "message", "id": "msg_1", "role": "assistant", "content": [{"type": "output_text", "text": "P"}]},
            {"type": "message", "role": "user", "content": "Italy?"},
        ],
    }
    assert affinity_key(first, ALICE) == affinity_key(later, ALICE) is not None


def test_a_continuation_keys_on_the_response_it_continues() -> None:
    body = {"model": "smol", "previous_response_id": "resp_1", "input": [{"role": "user", "content": "And?"}]}
    assert affinity_key(body, ALICE) == response_key(ALICE, "resp_1")
    assert affinity_key(body, BOB) == response_key(BOB, "resp_1") != response_key(ALICE, "resp_1")


def test_another_owner_salt_model_or_opening_is_another_key() -> None:
    first, _ = _turns(CHAT)
    key = affinity_key(first, ALICE)
    assert affinity_key(first, BOB) != key  # no owner learns from routing what another sent
    assert affinity_key({**first, "cache_salt": "tenant-1"}, ALICE) != key
    assert affinity_key({**first, "extensions": {"cache_salt": "tenant-1"}}, ALICE) != key
    assert affinity_key({**first, "model": "other"}, ALICE) != key
    other = [CHAT[0], {"role": "user", "content": "Germany's capital?"}]
    assert affinity_key({**first, "messages": other}, ALICE) != key


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"model": "smol"},
        {"model": "smol", "input": "France?"},  # one string: an embeddings input looks the same
        {"model": "smol", "input": ["a", "b"]},  # embeddings
        {"model": "smol", "prompt": "France?"},  # Ollama's generate
        {"model": "smol", "messages": [{"role": "system", "content": "Be brief."}]},  # no user message
        {"model": "smol", "messages": "France?"},
        {"model": "smol", "messages": [{"content": "no role"}]},
        {"model": 3, "messages": CHAT},
        {"model": "smol", "previous_response_id": 7},
    ],
)
def test_a_body_that_continues_no_conversation_has_no_key(body: dict[str, Any]) -> None:
    assert affinity_key(body, ALICE) is None
