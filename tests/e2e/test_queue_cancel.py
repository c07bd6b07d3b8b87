"""Issue 28, queues: a request cancelled while it waits for a slot ends at once and gives its
queue place back; a queue that holds only cancelled work refuses nobody.

On `server_one_slot` (one slot, a queue of one): a stream holds the slot, a background
response waits in the queue, and its cancel must answer without waiting for the slot.
"""

from __future__ import annotations

import socket
import time

import httpx

from helpers import MODEL, body, read_until, send_post

LONG = body("Write a very long essay about mountains.", max_output_tokens=3000, temperature=0)
# Far below what the stream holding the slot takes (3,000 tokens: ~20 s and more here), far
# above a cancel that is answered at once on a loaded 2-core machine.
AT_ONCE = 5.0


def _background(c: httpx.Client, text: str) -> httpx.Response:
    return c.post("/v1/responses", json={"model": MODEL, "input": text, "max_output_tokens": 3000, "background": True})


def test_cancel_of_a_queued_request_ends_it_at_once_and_frees_its_place(server_one_slot):
    with (
        socket.create_connection(("127.0.0.1", server_one_slot.port)) as holder,
        httpx.Client(base_url=server_one_slot.url, timeout=AT_ONCE) as c,
    ):
        send_post(holder, {**LONG, "stream": True})
        read_until(holder, b"output_text.delta")  # it holds the one slot now
        queued = _background(c, "Write a very long essay about rivers.")
        assert queued.status_code == 200, queued.text
        rid = queued.json()["id"]
        started = time.monotonic()
        cancelled = c.post(f"/v1/responses/{rid}/cancel")  # before: waited for the slot (ReadTimeout)
        took = time.monotonic() - started
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        assert took < AT_ONCE, took
        # Its place is free: the next request is queued, not refused with 429.
        nxt = _background(c, "Write a very long essay about lakes.")
        assert nxt.status_code == 200, nxt.text
        assert c.post(f"/v1/responses/{nxt.json()['id']}/cancel").json()["status"] == "cancelled"
        assert c.get(f"/v1/responses/{rid}").json()["status"] == "cancelled"


def test_a_queued_stream_whose_client_left_frees_its_place(server_one_slot):
    with socket.create_connection(("127.0.0.1", server_one_slot.port)) as holder:
        send_post(holder, {**LONG, "stream": True})
        read_until(holder, b"output_text.delta")
        with socket.create_connection(("127.0.0.1", server_one_slot.port)) as waiting:
            send_post(waiting, {**LONG, "stream": True})
            read_until(waiting, b"event: response.created")  # in the queue of one, which it fills
        # It left: once the service notices, its place is free while the slot is still held.
        deadline = time.monotonic() + AT_ONCE
        with httpx.Client(base_url=server_one_slot.url, timeout=AT_ONCE) as c:
            while True:
                r = _background(c, "Write a very long essay about hills.")
                if r.status_code != 429 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert r.status_code == 200, r.text
            assert c.post(f"/v1/responses/{r.json()['id']}/cancel").json()["status"] == "cancelled"
