"""Stored responses and continuing from them (R6.1-5..7, R6.2-6)."""

from __future__ import annotations

from typing import Any

from helpers import MODEL, SCRIPTED, assert_problem, body, checked_client, stream, user

URL = "/lmsp/v1/responses"


def _text(response: dict[str, Any]) -> str:
    return "".join(part["text"] for item in response["output"] for part in item["content"])


def test_stored_response_reads_back(client):  # covers: R6.1-5, R6.2-6
    created = client.post(URL, json=body("Name a fruit.", max_output_tokens=8, temperature=0, store=True))
    assert created.status_code == 200
    got = client.get(f"{URL}/{created.json()['id']}")
    assert got.status_code == 200
    assert got.headers["lmsp-version"] == "1.0"
    assert got.json() == created.json()


def test_streamed_and_stored_agree(client):  # covers: R6.1-5, R6.3-4
    _, events = stream(client, body("Name a river.", max_output_tokens=12, temperature=0, store=True))
    rid = events[0][2]["response_id"]
    stored = client.get(f"{URL}/{rid}").json()
    [done] = [d for _, n, d in events if n == "response.output_item.done"]
    assert stored["output"] == [done["item"]]
    assert stored["usage"] == events[-1][2]["usage"]
    assert stored["status"] == events[-1][2]["status"]


def test_not_stored_without_store(client):  # covers: R6.1-5, R6.2-6
    rid = client.post(URL, json=body("Hi", max_output_tokens=2)).json()["id"]
    doc = assert_problem(client.get(f"{URL}/{rid}"), 404, "response_not_found")
    assert rid in doc["detail"]


def test_unknown_response_id(client):  # covers: R6.2-6
    assert_problem(client.get(f"{URL}/resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF"), 404, "response_not_found")
    assert_problem(client.get(f"{URL}/nonsense"), 404, "response_not_found")


def test_unknown_previous_response_id(client):  # covers: R6.1-6
    r = client.post(URL, json=body("Hi", previous_response_id="resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF"))
    assert_problem(r, 404, "response_not_found", param="previous_response_id")


def test_continuation_equals_sending_the_whole_context(client):  # covers: R6.1-6
    first = client.post(URL, json=body("My cat is called Tom.", max_output_tokens=16, temperature=0, store=True)).json()
    follow_up = user("What is my cat called?")
    continued = client.post(
        URL,
        json={
            "model": MODEL,
            "input": follow_up,
            "previous_response_id": first["id"],
            "max_output_tokens": 16,
            "temperature": 0,
        },
    ).json()
    # The same turns sent in full, as a client without conversations would.
    whole = [*user("My cat is called Tom."), *first["output"], *follow_up]
    explicit = client.post(URL, json={"model": MODEL, "input": whole, "max_output_tokens": 16, "temperature": 0}).json()
    assert continued["usage"]["input_tokens"] == explicit["usage"]["input_tokens"]
    assert continued["usage"]["input_tokens"] > first["usage"]["total_tokens"]
    assert _text(continued) == _text(explicit)


def test_chain_of_continuations_on_fresh_connections(server):  # covers: R6.1-6, R6.1-7
    # Every turn on a new connection: the conversation lives in the store, not in a socket.
    previous = None
    seen = []
    for word in ("alpha", "beta", "gamma"):
        with checked_client(server.url) as c:
            payload = body(word, model=SCRIPTED, store=True, previous_response_id=previous)
            resp = c.post(URL, json=payload).json()
        seen.append(word)
        previous = resp["id"]
        # The scripted model counts a token per word of "role: text" lines: two per message,
        # and every earlier turn brings its user message and the echo that answered it.
        assert resp["usage"]["input_tokens"] == 2 * (2 * len(seen) - 1), resp
    with checked_client(server.url) as c:
        assert c.get(f"{URL}/{previous}").json()["output"][0]["content"][0]["text"] == "gamma"


def test_get_while_running_is_in_progress(server, client):  # covers: R6.2-2, R6.2-6
    with (
        checked_client(server.url, timeout=30) as streaming,
        streaming.stream("POST", URL, json=body("!slow 400 a b c", model=SCRIPTED, store=True, stream=True)) as r,
    ):
        lines = r.iter_lines()
        rid = next(line for line in lines if line.startswith("data:")).split('"response_id":"')[1].split('"')[0]
        during = client.get(f"{URL}/{rid}").json()
        assert during["status"] == "in_progress"
        assert during["usage"] is None
        for _ in lines:
            pass
    after = client.get(f"{URL}/{rid}").json()
    assert after["status"] == "completed"
    assert after["output"][0]["content"][0]["text"] == "a b c"


def test_stored_failure_reads_back_failed(client):  # covers: R6.2-5, R6.2-6
    _, events = stream(client, body("!fail 2", model=SCRIPTED, store=True))
    stored = client.get(f"{URL}/{events[0][2]['response_id']}").json()
    assert stored["status"] == "failed"
    assert stored["error"]["code"] == "generation_failed"
    assert stored["output"][0]["content"][0]["text"] == "w w "
