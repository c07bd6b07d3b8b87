"""`Idempotency-Key` (§9, profile): replays, reuse, conflicts, syntax, expiry."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from helpers import KEEPALIVE, SCRIPTED, TASKS, assert_problem, body, checked_client, read_until, send_post, wait_final
from lmsp.http.replays import Replays, fingerprint
from lmsp.store import SqliteStore, StoreWorker

URL = "/lmsp/v1/responses"
HEADER = "Idempotency-Key"


def _key() -> str:
    return str(uuid.uuid4())


def test_same_key_same_body_replays_the_first_result(client):  # covers: R9-3
    key = _key()
    payload = body("Name a colour.", max_output_tokens=8, temperature=1.0)
    first = client.post(URL, json=payload, headers={HEADER: key})
    again = client.post(URL, json=payload, headers={HEADER: key})
    assert first.status_code == again.status_code == 200
    assert again.content == first.content  # the same response id: nothing ran twice
    assert again.headers["content-type"] == first.headers["content-type"]
    assert again.headers["lmsp-version"] == "1.0"
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    # key order and spacing are not part of "the same body"
    reordered = client.post(URL, json=dict(reversed(list(payload.items()))), headers={HEADER: key})
    assert reordered.content == first.content


def test_stream_replays_the_recorded_events(client):  # covers: R9-3, R6.3-1
    key = _key()
    payload = body("one two three", model=SCRIPTED, stream=True)
    first = client.post(URL, json=payload, headers={HEADER: key})
    again = client.post(URL, json=payload, headers={HEADER: key})
    assert first.headers["content-type"] == again.headers["content-type"] == "text/event-stream"
    assert again.content == first.content
    assert b"event: response.completed" in again.content
    assert b": keep-alive" not in again.content


def test_same_key_other_body_is_422(client):  # covers: R9-3
    key = _key()
    assert client.post(URL, json=body("a", model=SCRIPTED), headers={HEADER: key}).status_code == 200
    r = client.post(URL, json=body("b", model=SCRIPTED), headers={HEADER: key})
    assert_problem(r, 422, "idempotency_key_reused", param=HEADER)


def test_same_key_while_the_first_runs_is_409(server, client):  # covers: R9-3
    key = _key()
    payload = body("!slow 100 a b c d", model=SCRIPTED, stream=True)
    with checked_client(server.url) as other, other.stream("POST", URL, json=payload, headers={HEADER: key}) as first:
        chunks = first.iter_bytes()
        seen = b""
        # The first stream has started, so it holds the key until its final event.
        while b"event: response.created" not in seen:
            seen += next(chunks)
        conflict = client.post(URL, json=payload, headers={HEADER: key})
        whole = seen + b"".join(chunks)
    assert_problem(conflict, 409, "idempotency_conflict", param=HEADER)
    assert conflict.headers["retry-after"] == "1"
    assert b"event: response.completed" in whole
    assert client.post(URL, json=payload, headers={HEADER: key}).content == whole.replace(KEEPALIVE, b"")


def test_bare_and_quoted_keys_are_the_same_key(client):  # covers: R9-3
    key = _key()
    payload = body("quoted", model=SCRIPTED)
    bare = client.post(URL, json=payload, headers={HEADER: key})
    quoted = client.post(URL, json=payload, headers={HEADER: f'"{key}"'})
    assert quoted.headers["idempotent-replayed"] == "true"
    assert quoted.content == bare.content


@pytest.mark.parametrize("value", ["", "x" * 256, '""', '"unterminated', "tab\there", "naïve".encode(), 'a"b'])
def test_malformed_keys_are_400(client, value):  # covers: R9-3
    r = client.post(URL, json=body("x", model=SCRIPTED), headers={HEADER: value})
    assert_problem(r, 400, "invalid_request", param=HEADER)


def test_longest_key_is_accepted(client):  # covers: R9-3
    r = client.post(URL, json=body("x", model=SCRIPTED), headers={HEADER: "k" * 255})
    assert r.status_code == 200


def test_two_keys_are_400(client):  # covers: R9-3
    headers = [(HEADER, _key()), (HEADER, _key()), ("content-type", "application/json")]
    r = client.post(URL, content=b'{"model":"scripted:test","input":[]}', headers=headers)
    assert_problem(r, 400, "invalid_request", param=HEADER)


def test_failed_generation_is_replayed(client):  # covers: R9-3, R6.2-5
    key = _key()
    payload = body("!fail 1", model=SCRIPTED)
    first = client.post(URL, json=payload, headers={HEADER: key})
    assert_problem(first, 500, "generation_failed")
    again = client.post(URL, json=payload, headers={HEADER: key})
    assert again.status_code == 500 and again.content == first.content


def test_refused_before_running_leaves_the_key_free(client):  # covers: R9-3
    key = _key()
    assert_problem(client.post(URL, json=body("x", model="nope:1b"), headers={HEADER: key}), 404, "model_not_found")
    # Nothing ran, so nothing is replayed and the key is not bound to that body.
    assert client.post(URL, json=body("x", model=SCRIPTED), headers={HEADER: key}).status_code == 200


def test_invalid_body_is_refused_before_the_key_is_looked_at(client):  # covers: R9-3, R6.1-9
    key = _key()
    assert_problem(
        client.post(URL, json={"model": SCRIPTED}, headers={HEADER: key}), 400, "invalid_request", param="input"
    )
    assert client.post(URL, json=body("x", model=SCRIPTED), headers={HEADER: key}).status_code == 200


# --- tasks: a retried POST /tasks is the same task, never a second generation


def test_a_retried_task_is_the_same_task(client):  # covers: R9-3, R7-1
    key = _key()
    payload = body("!slow 20 one two three", model=SCRIPTED)
    first = client.post(TASKS, json=payload, headers={HEADER: key})
    again = client.post(TASKS, json=payload, headers={HEADER: key})
    assert first.status_code == again.status_code == 202
    assert again.content == first.content  # the same task id and response id: one generation
    assert again.headers["location"] == first.headers["location"] == f"{TASKS}/{first.json()['id']}"
    assert again.headers["idempotent-replayed"] == "true"
    assert "idempotent-replayed" not in first.headers
    # Replayed after the task ended too, and the one task it names ran once, to its end.
    final = wait_final(client, first.json()["id"])
    assert client.post(TASKS, json=payload, headers={HEADER: key}).content == first.content
    assert final["response"]["output"][0]["content"][0]["text"] == "one two three"


def test_concurrent_retries_of_a_task_start_one_task(server):  # covers: R9-3
    key = _key()
    payload = body("!slow 20 at once", model=SCRIPTED)
    start = threading.Barrier(8)

    def post(_: int) -> httpx.Response:
        with checked_client(server.url) as c:
            start.wait()
            return c.post(TASKS, json=payload, headers={HEADER: key})

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(post, range(8)))
    accepted = [a for a in answers if a.status_code == 202]
    assert {a.json()["id"] for a in accepted} == {accepted[0].json()["id"]}
    assert sum("idempotent-replayed" not in a.headers for a in accepted) == 1  # the one that ran
    for refused in (a for a in answers if a.status_code != 202):
        assert_problem(refused, 409, "idempotency_conflict", param=HEADER)


@pytest.mark.parametrize("first_route", [URL, TASKS])
def test_a_key_belongs_to_the_route_it_was_used_on(client, first_route):  # covers: R9-3
    key = _key()
    payload = body("same body", model=SCRIPTED)
    other_route = TASKS if first_route == URL else URL
    assert client.post(first_route, json=payload, headers={HEADER: key}).status_code in (200, 202)
    # Not a replay of the other route's answer, and not a second run: the key is taken.
    r = client.post(other_route, json=payload, headers={HEADER: key})
    assert_problem(r, 422, "idempotency_key_reused", param=HEADER)


def test_a_task_refused_before_running_leaves_the_key_free(client):  # covers: R9-3
    key = _key()
    refused = client.post(TASKS, json=body("x", model=SCRIPTED, stream=False), headers={HEADER: key})
    assert_problem(refused, 400, "invalid_request", "stream")
    retry = client.post(TASKS, json=body("x", model=SCRIPTED), headers={HEADER: key})
    assert retry.status_code == 202 and "idempotent-replayed" not in retry.headers


# --- the records themselves: expiry and owners, on a real SQLite store with a settable clock


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_records_expire_after_24_hours(tmp_path):  # covers: R9-3
    async def run() -> None:
        clock = _Clock()
        worker = StoreWorker(SqliteStore(tmp_path / "s.sqlite3"))
        idem = Replays(worker, clock=clock)
        one, two = fingerprint("POST /x", {"a": 1}), fingerprint("POST /x", {"a": 2})
        assert await idem.begin("local", "k", one) is None
        await idem.finish("local", "k", 200, [("content-type", "application/json")], b"{}")
        clock.now += 24 * 3600 - 1
        record = await idem.begin("local", "k", one)
        assert record is not None and record.body == b"{}"
        with pytest.raises(Exception, match="different request body"):
            await idem.begin("local", "k", two)
        clock.now += 2  # past 24 h: the key is free again, for any body
        assert await idem.begin("local", "k", two) is None
        worker.close()

    asyncio.run(run())


def test_records_are_kept_per_owner(tmp_path):  # covers: R9-3
    async def run() -> None:
        worker = StoreWorker(SqliteStore(tmp_path / "s.sqlite3"))
        idem = Replays(worker)
        a, b = fingerprint("POST /x", {"a": 1}), fingerprint("POST /x", {"b": 1})
        assert await idem.begin("token-a", "k", a) is None
        assert await idem.begin("token-b", "k", b) is None  # another token's key, not a reuse
        worker.close()

    asyncio.run(run())


def test_claims_left_running_by_a_dead_process_are_dropped(tmp_path):  # covers: R9-3
    path = tmp_path / "s.sqlite3"
    store = SqliteStore(path)
    assert store.claim_key("local", "k", b"x", 0.0, 100.0) is None
    store.close()
    reopened = SqliteStore(path)  # as after a crash mid-request: the retry must not get 409
    assert reopened.claim_key("local", "k", b"y", 1.0, 100.0) is None
    reopened.close()


def test_client_gone_before_the_result_leaves_the_key_free(server, client):  # covers: R9-3, R6.3-6
    key = _key()
    payload = body("!slow 50 " + "w " * 20, model=SCRIPTED, stream=True)
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        send_post(sock, payload, {HEADER: key})
        read_until(sock, b"output_text.delta")
    # The first client never got a result: the retry runs (and is not a replay, nor a 409).
    deadline = time.monotonic() + 10
    while True:
        retry = client.post(URL, json=payload, headers={HEADER: key}, timeout=60)
        if retry.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.1)  # the first run is still noticing that its client left
    assert retry.status_code == 200
    assert "idempotent-replayed" not in retry.headers
