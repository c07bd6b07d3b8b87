"""Failures, cancellation and vanished clients, with the scripted model and the real one."""

from __future__ import annotations

import time

import httpx

from helpers import SCRIPTED, assert_problem, body, raw_stream_then_close, stream
from lmsp._core import SseParser

URL = "/lmsp/v1/responses"


def test_backend_failure_sync_is_a_problem(client):  # covers: R6.2-5
    r = client.post(URL, json=body("!fail 3", model=SCRIPTED))
    assert_problem(r, 500, "generation_failed")


def test_backend_failure_stream_ends_failed(client):  # covers: R6.2-5, R6.3-2, R6.3-3
    _, events = stream(client, body("!fail 3", model=SCRIPTED))
    names = [n for _, n, _ in events]
    assert names[:2] == ["response.created", "response.output_item.added"]
    assert names.count("response.output_text.delta") == 3
    assert names[-1] == "response.failed"
    data = events[-1][2]
    assert data["status"] == "failed"
    assert data["error"]["code"] == "generation_failed"
    assert data["error"]["type"] == "urn:lmsp:error:generation_failed"


def test_scripted_echo_completes(client):  # covers: R6.3-4
    _, events = stream(client, body("one two three", model=SCRIPTED))
    deltas = [d["delta"] for _, n, d in events if n == "response.output_text.delta"]
    assert deltas == ["one ", "two ", "three"]
    assert events[-1][1] == "response.completed"


def test_vanished_client_frees_the_scripted_backend(server, client):  # covers: R6.3-6
    # The scripted backend plays one sequence at a time: a 50 s script left running would
    # hold the next request behind it.
    raw_stream_then_close(server.port, body("!slow 50 " + "w " * 1000, model=SCRIPTED), b"response.output_text.delta")
    started = time.monotonic()
    r = client.post(URL, json=body("after", model=SCRIPTED))
    assert r.status_code == 200
    assert time.monotonic() - started < 10  # the abandoned script alone would take 50 s


def test_vanished_client_frees_the_model(server_one_slot):  # covers: R6.3-6
    # 3,000 tokens at ~120 tok/s would hold the model's only slot for ~25 s.
    payload = body("Write a very long essay about rivers.", max_output_tokens=3000)
    raw_stream_then_close(server_one_slot.port, payload, b"output_text.delta")
    started = time.monotonic()
    r = httpx.post(f"{server_one_slot.url}{URL}", json=body("Hi", max_output_tokens=4), timeout=60)
    assert r.status_code == 200
    assert time.monotonic() - started < 10


def test_keepalive_comment_while_idle(server):  # covers: R6.3-5
    # The test server sends keep-alives after 1 s of silence (15 s by default).
    parser = SseParser()
    with (
        httpx.Client(base_url=server.url, timeout=60) as c,
        c.stream("POST", URL, json=body("!slow 2500 a b", model=SCRIPTED, stream=True)) as r,
    ):
        for chunk in r.iter_bytes():
            parser.feed(chunk)
            if parser.take_comments():
                break
        else:
            raise AssertionError("no keep-alive comment")
