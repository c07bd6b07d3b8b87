"""A client that goes away stops its generation within a decode step and frees the model's
slot (R6.3-6), measured by timing the next request against the same request on an idle model;
and a stream that waits on a long prompt is kept alive meanwhile (R6.3-5).

test_lifecycle.py shows the slot comes back at all (< 10 s instead of ~25 s); these tests
bound how soon, and add the sync view, whose client can vanish too.
"""

from __future__ import annotations

import socket
import time

import httpx

from lmsp._core import SseParser

from helpers import MODEL, body, raw_stream_then_close, send_post

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
    with socket.create_connection(("127.0.0.1", server_one_slot.port)) as sock:
        send_post(sock, LONG)
        time.sleep(0.5)  # generating by now, with nobody to read the answer
    after = _next_request_seconds(server_one_slot.url)
    assert after < idle + SLACK, (idle, after)


def test_keepalive_while_a_long_prompt_is_read(server):  # covers: R6.3-5
    # ~800 prompt tokens take over a second to read on a CPU; the test server sends a comment
    # after each second of silence, so the client sees the connection is alive before the
    # first token.
    prompt = "Summarise this. " + "The river runs to the sea and the sea runs to the sky. " * 55
    parser = SseParser()
    comments_before_output = 0
    with httpx.Client(base_url=server.url, timeout=120) as c, c.stream(
        "POST", URL, json=body(prompt, model=MODEL, max_output_tokens=1, stream=True)
    ) as r:
        for chunk in r.iter_bytes():
            events = parser.feed(chunk)
            if any(e.event == "response.output_item.added" for e in events):
                break
            comments_before_output += parser.take_comments().count("keep-alive")
    assert comments_before_output >= 1
