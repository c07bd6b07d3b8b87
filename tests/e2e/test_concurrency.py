"""Many streams on one model: continuous batching must not change results, must keep short
requests moving past long ones, must survive cancels mid-batch and readers that stall, and
must refuse work (429) instead of queueing without bound."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from helpers import assert_problem, body, raw_stream_then_close, read_until, send_post, stream
from lmsp.client.sse import iter_events
from lmsp.testing import RunningServer, start_server

URL = "/lmsp/v1/responses"
PROMPTS = [
    "Name three rivers in Europe.",
    "What is a prime number?",
    "Write a haiku about snow.",
    "Explain what a compiler does.",
]


def _text(response: dict) -> str:
    return response["output"][0]["content"][0]["text"]


def _sync(url: str, payload: dict) -> dict:
    with httpx.Client(base_url=url, timeout=120) as c:
        r = c.post(URL, json=payload)
        assert r.status_code == 200, r.text
        return r.json()


@pytest.fixture(scope="module")
def flash_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # Outputs that do not depend on their batch are what `--flash-attn on` keeps, at contexts
    # under 256 tokens (docs/operations/concurrency.md#flash-attention); the default on a CPU
    # (off) does not: the staggered test below differed in 2 of 10 runs with it.
    srv = start_server(tmp_path_factory.mktemp("flash"), "--flash-attn", "on", "--parallel", "4")
    yield srv
    srv.stop()


def test_concurrent_streams_match_each_alone(flash_server):
    server = flash_server
    payloads = [body(p, max_output_tokens=32, temperature=0) for p in PROMPTS]
    alone = [_text(_sync(server.url, p)) for p in payloads]
    with ThreadPoolExecutor(len(payloads)) as pool:
        together = [_text(r) for r in pool.map(lambda p: _sync(server.url, p), payloads)]
    assert together == alone
    assert len(set(alone)) == len(alone)  # four different answers, not one repeated


def _streamed_text(url: str, payload: dict, first_delta: threading.Event) -> str:
    text = []
    with httpx.Client(base_url=url, timeout=120) as c, c.stream("POST", URL, json={**payload, "stream": True}) as r:
        assert r.status_code == 200
        for event in iter_events(r.iter_bytes()):
            if event.event == "response.output_text.delta":
                text.append(orjson.loads(event.data)["delta"])
                first_delta.set()
    return "".join(text)


def test_staggered_arrivals_match_each_alone(flash_server):
    server = flash_server
    # Each request arrives once the one before it generates, in an order unlike the slots':
    # steps then mix generating tokens and prompt chunks in every arrangement (the batch is
    # laid out in slot order, T=0 reads the argmax in place), and each output must still be
    # the one it gets alone. Fresh prompts, read first while others generate: the runs alone
    # come after.
    nonce = uuid.uuid4().hex[:8]
    payloads = [body(f"{p} (run {nonce})", max_output_tokens=40, temperature=0) for p in PROMPTS]
    together: dict[int, str] = {}
    threads = []
    for i in (2, 0, 3, 1):
        started = threading.Event()
        t = threading.Thread(
            target=lambda i=i, started=started: together.__setitem__(
                i, _streamed_text(server.url, payloads[i], started)
            )
        )
        t.start()
        threads.append(t)
        assert started.wait(timeout=60)
    for t in threads:
        t.join(timeout=120)
    alone = [_text(_sync(server.url, p)) for p in payloads]
    assert [together[i] for i in range(len(payloads))] == alone
    assert len(set(alone)) == len(alone)


def test_a_prompt_shared_with_a_busy_slot_is_copied_not_decoded_again(flash_server):
    server = flash_server
    # Two conversations with the same long instructions: the second arrives while the first
    # generates, in a slot that never saw them, and takes the first one's KV cells for the
    # shared start (usage says so) instead of decoding them; its output is the one it gets
    # alone, byte for byte.
    nonce = uuid.uuid4().hex[:8]
    instructions = (
        f"You are a careful assistant for the harbour office ({nonce}). " + "Answer briefly and politely. " * 20
    )

    def conversation(question: str, tokens: int) -> dict:
        payload = body(question, max_output_tokens=tokens, temperature=0)
        system = {"type": "message", "role": "system", "content": [{"type": "input_text", "text": instructions}]}
        return {**payload, "input": [system, *payload["input"]]}

    first, second = conversation("Write a long story about a ship.", 300), conversation("What is a lighthouse?", 24)
    started = threading.Event()
    runner = threading.Thread(target=_streamed_text, args=(server.url, first, started))
    runner.start()
    assert started.wait(timeout=60)
    together = _sync(server.url, second)
    runner.join(timeout=120)
    assert together["usage"]["input_tokens_details"]["cached_tokens"] >= 100
    assert _text(together) == _text(_sync(server.url, second))


def _first_delta_at(url: str, payload: dict, marks: dict, key: str, submitted: threading.Event | None = None) -> None:
    """Notes when the stream's first delta arrives; sets `submitted` once `response.created`
    has: the service sends it only after the request is in the model's queue."""
    seen = b""
    with httpx.Client(base_url=url, timeout=120) as c, c.stream("POST", URL, json={**payload, "stream": True}) as r:
        for chunk in r.iter_bytes():
            seen = seen[-64:] + chunk  # an event name cut across two chunks still matches
            if submitted is not None and b"event: response.created" in seen:
                submitted.set()
            if key not in marks and b"output_text.delta" in seen:
                marks[key] = time.monotonic()


def test_short_prompt_is_not_held_behind_a_long_one(server):
    # ~1,500 prompt tokens take several prefill steps; a short prompt arriving just after
    # must get its first token before the long one does.
    long_payload = body("Summarise this text. " + "The river flows past the old mill. " * 180, max_output_tokens=4)
    short_payload = body("Say yes.", max_output_tokens=4)
    marks: dict[str, float] = {}
    long_submitted = threading.Event()
    long_thread = threading.Thread(
        target=_first_delta_at, args=(server.url, long_payload, marks, "long", long_submitted)
    )
    long_thread.start()
    assert long_submitted.wait(timeout=60)
    _first_delta_at(server.url, short_payload, marks, "short")
    long_thread.join(timeout=120)
    assert marks["short"] < marks["long"]


def test_cancel_mid_batch_leaves_the_others_intact(flash_server):
    # On the flash-attention server, as the other batch-independence tests: with it off (the
    # CPU default) T=0 outputs may depend on their batch, and did on the portable wheel.
    server = flash_server
    payloads = [body(p, max_output_tokens=32, temperature=0) for p in PROMPTS[:3]]
    alone = [_text(_sync(server.url, p)) for p in payloads]
    victim = body("Write a very long story about a lighthouse.", max_output_tokens=2000)
    with ThreadPoolExecutor(4) as pool:
        results = [pool.submit(_sync, server.url, p) for p in payloads]
        pool.submit(raw_stream_then_close, server.port, victim, b"output_text.delta").result()
        together = [_text(r.result()) for r in results]
    assert together == alone


def test_stalled_reader_does_not_slow_the_others(server):
    # A client that sends a streaming request and never reads: its events wait in its log
    # (bounded by max_output_tokens and the context window); everyone else goes on.
    payload = {**body("Write a long story about a cat.", max_output_tokens=1500), "stream": True}
    with socket.create_connection(("127.0.0.1", server.port)) as stalled:
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        send_post(stalled, payload)
        with httpx.Client(base_url=server.url, timeout=120) as client:
            for prompt in PROMPTS[:2]:
                response, events = stream(client, body(prompt, max_output_tokens=24))
                assert response.status_code == 200
                assert events[-1][1] in ("response.completed", "response.incomplete")
    # and after it is gone, the server still serves
    assert _sync(server.url, body("Hi", max_output_tokens=2))["status"] in ("completed", "incomplete")


def test_full_queue_answers_429(server_one_slot):
    url = server_one_slot.url
    long = body("Write a very long essay about mountains.", max_output_tokens=3000)
    # One sequence decoding, one waiting in the queue of one: the next is refused.
    with socket.create_connection(("127.0.0.1", server_one_slot.port)) as first:
        send_post(first, {**long, "stream": True})
        read_until(first, b"output_text.delta")
        with socket.create_connection(("127.0.0.1", server_one_slot.port)) as second:
            send_post(second, {**long, "stream": True})
            # Sent once the request is in the model's queue of one, which it now fills.
            read_until(second, b"event: response.created")
            r = httpx.post(f"{url}{URL}", json=body("Hi", max_output_tokens=2), timeout=30)
            doc = assert_problem(r, 429, "overloaded")
            assert int(r.headers["retry-after"]) >= 1
            assert "queue" in doc["detail"]
    # Both vanished: the slot and the queue free up, and the model serves again.
    deadline = time.monotonic() + 30
    while True:
        r = httpx.post(f"{url}{URL}", json=body("Hi", max_output_tokens=2), timeout=60)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200
