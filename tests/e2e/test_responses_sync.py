"""The sync view of a response, from the real model (§6.2)."""

from __future__ import annotations

import time

from helpers import MODEL, body, has_id


def test_sync_response_object(client):  # covers: R6.1-1, R6.2-1, R6.2-2, R6.2-3
    before = int(time.time())
    r = client.post("/lmsp/v1/responses", json=body("Name a colour.", max_output_tokens=24, temperature=0))
    assert r.status_code == 200
    assert r.headers["lmsp-version"] == "1.0"
    assert r.headers["content-type"] == "application/json"
    resp = r.json()
    assert set(resp) == {
        "id",
        "object",
        "created_at",
        "status",
        "model",
        "output",
        "usage",
        "error",
        "incomplete_details",
    }
    assert has_id(resp["id"], "resp")
    assert resp["object"] == "response"
    assert before <= resp["created_at"] <= int(time.time())
    assert resp["model"] == MODEL
    assert resp["status"] in ("completed", "incomplete")
    [item] = resp["output"]
    assert has_id(item["id"], "msg")
    assert item["type"] == "message" and item["role"] == "assistant"
    [part] = item["content"]
    assert part["type"] == "output_text" and part["text"].strip()
    usage = resp["usage"]
    assert usage["input_tokens"] > 10  # the chat template's system prompt is counted too
    assert 1 <= usage["output_tokens"] <= 24
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert resp["error"] is None


def test_max_output_tokens_gives_incomplete(client):  # covers: R6.2-4
    r = client.post("/lmsp/v1/responses", json=body("Write a long story about a dragon.", max_output_tokens=5))
    resp = r.json()
    assert resp["status"] == "incomplete"
    assert resp["incomplete_details"] == {"reason": "max_output_tokens"}
    assert resp["usage"]["output_tokens"] == 5


def test_temperature_zero_is_deterministic(client):  # covers: R6.1-1
    payload = body("Say hello in French.", max_output_tokens=16, temperature=0)
    first = client.post("/lmsp/v1/responses", json=payload).json()
    second = client.post("/lmsp/v1/responses", json=payload).json()
    assert first["output"][0]["content"] == second["output"][0]["content"]
    assert first["id"] != second["id"]


def test_seeded_sampling_repeats_and_temperature_matters(client):  # covers: R6.1-1
    payload = body("Invent a name for a cat.", max_output_tokens=24, temperature=1.5, extensions={"seed": 7})
    texts = {
        client.post("/lmsp/v1/responses", json=payload).json()["output"][0]["content"][0]["text"] for _ in range(2)
    }
    assert len(texts) == 1
    others = {
        client.post("/lmsp/v1/responses", json={**payload, "extensions": {"seed": s}}).json()["output"][0]["content"][
            0
        ]["text"]
        for s in (1, 2, 3)
    }
    assert len(others | texts) > 1


def test_multi_turn_input_and_system_message(client):  # covers: R6.1-2
    items = [
        {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "You answer in one word."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Capital of Italy?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Rome."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "And of Spain?"}]},
    ]
    r = client.post(
        "/lmsp/v1/responses", json={"model": MODEL, "input": items, "max_output_tokens": 8, "temperature": 0}
    )
    assert r.status_code == 200
    resp = r.json()
    assert resp["usage"]["input_tokens"] > 20
    assert resp["output"][0]["content"][0]["text"]
