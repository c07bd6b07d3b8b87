"""The stream view of a response, from the real model (§6.3, §6.4)."""

from __future__ import annotations

from helpers import body, has_id, stream

FINAL = {"response.completed", "response.incomplete", "response.failed", "response.cancelled", "error"}


def test_stream_event_sequence(client):  # covers: R6.1-1, R6.3-1, R6.3-2, R6.3-3, R6.4-1
    response, events = stream(client, body("Tell me a fact about the sea.", max_output_tokens=32, temperature=0))
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream"
    assert response.headers["lmsp-version"] == "1.0"
    ids = [e[0] for e in events]
    assert ids == list(range(1, len(events) + 1))
    names = [e[1] for e in events]
    assert names[0] == "response.created"
    assert names[1] == "response.output_item.added"
    assert set(names[2:-2]) == {"response.output_text.delta"}
    assert names[-2] == "response.output_item.done"
    assert names[-1] in ("response.completed", "response.incomplete")
    assert sum(n in FINAL for n in names) == 1

    rid = events[0][2]["response_id"]
    assert has_id(rid, "resp")
    assert events[0][2] == {"response_id": rid, "status": "in_progress"}
    added = events[1][2]
    assert added["response_id"] == rid and added["output_index"] == 0
    assert added["item"]["content"] == [] and added["item"]["role"] == "assistant"
    item_id = added["item"]["id"]
    for _, _, data in events[2:-2]:
        assert set(data) == {"response_id", "item_id", "delta"}
        assert data["response_id"] == rid and data["item_id"] == item_id
    final = events[-1][2]
    assert final["response_id"] == rid
    usage = final["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_deltas_concatenate_to_item_text(client):  # covers: R6.3-4
    _, events = stream(client, body("Describe a forest in two sentences.", max_output_tokens=48, temperature=0.9))
    deltas = "".join(d["delta"] for _, n, d in events if n == "response.output_text.delta")
    [done] = [d for _, n, d in events if n == "response.output_item.done"]
    assert deltas == done["item"]["content"][0]["text"]
    assert deltas


def test_streamed_items_equal_sync_items(client):  # covers: R6.3-4
    payload = body("What is two plus two?", max_output_tokens=24, temperature=0)
    _, events = stream(client, payload)
    [done] = [d for _, n, d in events if n == "response.output_item.done"]
    sync = client.post("/lmsp/v1/responses", json=payload).json()
    streamed = dict(done["item"])
    synced = dict(sync["output"][0])
    streamed.pop("id"), synced.pop("id")  # each response has its own item ids
    assert streamed == synced
    # Token counts agree; how many input tokens the KV cache held depends on what ran before.
    counts = lambda usage: {k: v for k, v in usage.items() if k != "input_tokens_details"}  # noqa: E731
    assert counts(events[-1][2]["usage"]) == counts(sync["usage"])


def test_stream_incomplete_at_max_output_tokens(client):  # covers: R6.2-4, R6.3-2
    _, events = stream(client, body("Count from one to one hundred.", max_output_tokens=3))
    name, data = events[-1][1], events[-1][2]
    assert name == "response.incomplete"
    assert data["status"] == "incomplete"
    assert data["incomplete_details"] == {"reason": "max_output_tokens"}
    assert data["usage"]["output_tokens"] == 3


def test_unicode_survives_token_splits(client):  # covers: R6.3-4
    # Multi-byte characters are often split across tokens; deltas must still be whole UTF-8.
    _, events = stream(
        client, body("Écris une phrase en français avec des accents: é, è, à, ç.", max_output_tokens=40, temperature=0)
    )
    deltas = "".join(d["delta"] for _, n, d in events if n == "response.output_text.delta")
    assert "\ufffd" not in deltas
    [done] = [d for _, n, d in events if n == "response.output_item.done"]
    assert deltas == done["item"]["content"][0]["text"]
