"""A client that goes away stops its generation within a decode step and frees the model's
slot (R6.3-6), measured by timing the next request against the same request on an idle model;
and a stream that waits on a long prompt is kept alive meanwhile (R6.3-5).

test_lifecycle.py shows the slot comes back at all (< 10 s instead of ~25 s); these tests
bound how soon, and add the sync view, whose client can vanish too. Nothing here waits a
guessed time: each test waits for the state it needs, or measures the machine first.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from helpers import MODEL, body, raw_stream_then_close, raw_sync_behind_a_duplicate
from lmsp._core import SseParser
from lmsp.testing import RunningServer, start_server

URL = "/lmsp/v1/responses"
LONG = body("Write a very long essay about rivers.", max_output_tokens=3000, temperature=0)
NEXT = body("Hi", max_output_tokens=4, temperature=0)
# Noticing the closed socket, one decode step, and scheduling slack on a loaded 2-core box;
# a generation left running would instead hold the slot for ~25 s.
SLACK = 1.5


def _next_request_seconds(url: str) -> float:
    started = time.monotonic()
    r = httpx.post(f"{url}{URL}", json=NEXT, timeout=60)
    assert r.status_code == 200, r.text
    return time.monotonic() - started


def test_vanished_stream_frees_the_slot_at_once(server_one_slot):  # covers: R6.3-6
    idle = min(_next_request_seconds(server_one_slot.url) for _ in range(2))
    raw_stream_then_close(server_one_slot.port, LONG, b"output_text.delta")
    after = _next_request_seconds(server_one_slot.url)
    assert after < idle + SLACK, (idle, after)


def test_vanished_sync_client_frees_the_slot(server_one_slot):  # covers: R6.3-6
    idle = min(_next_request_seconds(server_one_slot.url) for _ in range(2))
    # Not a guess that it is generating by now: the duplicate's 409 says the service holds it.
    head, running = raw_sync_behind_a_duplicate(server_one_slot.port, LONG)
    assert head.startswith(b"HTTP/1.1 409 "), head
    running.close()  # nobody is left to read the answer
    after = _next_request_seconds(server_one_slot.url)
    assert after < idle + SLACK, (idle, after)


@pytest.fixture(scope="module")
def slow_reader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """The real model on one CPU thread with its whole trained window (8,192 tokens), so that
    reading a prompt can take seconds whatever the machine (a GPU reads 4,096 in milliseconds)."""
    srv = start_server(
        tmp_path_factory.mktemp("slow"),
        *("--gpu-layers", "0", "--threads", "1", "--parallel", "1", "--ctx-size", "8192", "--keepalive", "1"),
    )
    yield srv
    srv.stop()


SENTENCE = "The river runs to the sea and the sea runs to the sky. "


def _prompt(tag: str, sentences: int) -> dict:
    # A different first word each time: no prompt shares a cached prefix with another.
    return body(f"{tag}: summarise this. " + SENTENCE * sentences, model=MODEL, max_output_tokens=1, temperature=0)


def test_keepalive_while_a_long_prompt_is_read(slow_reader):  # covers: R6.3-5
    # Measure how fast this machine reads, then send a prompt that takes ~3 s to read; the
    # server sends a comment after each second of silence, so the client sees the connection
    # is alive before the first token.
    # The bare prompt first: it takes one-time costs out of the probe and counts the template.
    bare = httpx.post(f"{slow_reader.url}{URL}", json=_prompt("Warm", 0), timeout=120).json()["usage"]["input_tokens"]
    started = time.monotonic()
    probe = httpx.post(f"{slow_reader.url}{URL}", json=_prompt("Probe", 20), timeout=120).json()["usage"][
        "input_tokens"
    ]
    per_token = (time.monotonic() - started) / probe
    tokens_per_sentence = (probe - bare) / 20
    sentences = min(int(3.0 / per_token / tokens_per_sentence), int(8000 / tokens_per_sentence))
    if sentences * tokens_per_sentence * per_token < 2.0:
        pytest.skip(f"one CPU thread reads a whole window in under 2 s here ({1 / per_token:,.0f} tokens/s)")
    parser = SseParser()
    comments_before_output = 0
    with (
        httpx.Client(base_url=slow_reader.url, timeout=120) as c,
        c.stream("POST", URL, json={**_prompt("Test", sentences), "stream": True}) as r,
    ):
        for chunk in r.iter_bytes():
            events = parser.feed(chunk)
            comments_before_output += parser.take_comments().count("keep-alive")
            if any(e.event == "response.output_item.added" for e in events):
                break
    assert comments_before_output >= 1
