"""`GET /health`, `GET /ready` and the drain a SIGTERM starts (docs/operations/several-machines.md),
on a real server: liveness while it serves; readiness false while it drains and while Redis or
PostgreSQL cannot be reached past their bounded waits; a stream running at SIGTERM ends with its
whole answer, new work gets 503 with Retry-After, and a second signal or the deadline stops it
as a stop without a drain does."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import SCRIPTED, assert_problem, body, checked_client, create_task, parse_events, read_task_events
from lmsp.client import iter_events
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import missing_servers, postgres_pids, postgres_server, redis_process

URL = "/lmsp/v1/responses"
WORDS = [f"w{i}" for i in range(30)]
SLOW = "!slow 100 " + " ".join(WORDS)  # 30 tokens, 100 ms apart: 3 s
ANSWER = " ".join(WORDS)


def _server(tmp_path: Path, *args: str) -> RunningServer:
    return start_server(tmp_path, "--scripted-model", SCRIPTED, "--keepalive", "1", *args)


def _ready(url: str) -> tuple[int, dict[str, Any]]:
    r = httpx.get(f"{url}/ready", timeout=10)
    assert r.headers["cache-control"] == "no-store"
    return r.status_code, r.json()


def _wait_ready(url: str, status: int, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        got, doc = _ready(url)
        if got == status or time.monotonic() > deadline:
            assert got == status, doc
            return doc
        time.sleep(0.2)


def test_health_and_ready_need_no_token_and_say_nothing_private(server: RunningServer) -> None:
    r = httpx.get(f"{server.url}/health", timeout=10)
    assert (r.status_code, r.json()) == (200, {"status": "ok"})
    assert _ready(server.url) == (200, {"status": "ready"})
    # Without tokens, the loopback Host rule holds for probes as for every request.
    assert_problem(httpx.get(f"{server.url}/ready", headers={"host": "evil.example"}), 403, "host_not_allowed")
    assert httpx.post(f"{server.url}/ready", timeout=10).status_code == 405


def test_probes_answer_without_a_token_where_tokens_are_required(tmp_path: Path) -> None:
    from helpers import make_token

    data = tmp_path / "data"
    make_token(data, "responses:write")
    srv = _server(tmp_path, "--data-dir", str(data))
    try:
        assert_problem(httpx.get(f"{srv.url}/lmsp/v1/models", timeout=10), 401, "authentication_required")
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
        assert _ready(srv.url) == (200, {"status": "ready"})
    finally:
        srv.stop()


def _read_stream(url: str, payload: dict[str, Any], started: threading.Event, out: list[Any]) -> None:
    with (
        httpx.Client(base_url=url, timeout=60) as c,
        c.stream("POST", URL, json={**payload, "stream": True}) as r,
    ):
        for event in iter_events(r.iter_bytes()):
            out.append((event.event, event.data))
            if event.event == "response.output_text.delta":
                started.set()


def _text(events: list[Any]) -> str:
    import orjson

    return "".join(orjson.loads(d)["delta"] for n, d in events if n == "response.output_text.delta")


# Each face's new work, refused while draining (the scripted model has no embedder: the drain
# answers before the handler would find that out).
NEW_WORK = [
    ("/lmsp/v1/responses", body("x", model=SCRIPTED)),
    ("/lmsp/v1/tasks", body("x", model=SCRIPTED)),
    ("/lmsp/v1/embeddings", {"model": SCRIPTED, "input": "x"}),
    ("/v1/chat/completions", {"model": SCRIPTED, "messages": [{"role": "user", "content": "x"}]}),
    ("/v1/responses", {"model": SCRIPTED, "input": "x"}),
    ("/v1/messages", {"model": SCRIPTED, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}),
    ("/api/generate", {"model": SCRIPTED, "prompt": "x"}),
    ("/api/chat", {"model": SCRIPTED, "messages": [{"role": "user", "content": "x"}]}),
]


def test_drain_finishes_running_work_and_refuses_new(tmp_path: Path) -> None:
    srv = _server(tmp_path, "--drain-timeout", "30")
    try:
        with checked_client(srv.url) as c:
            events: list[Any] = []
            started = threading.Event()
            reader = threading.Thread(target=_read_stream, args=(srv.url, body(SLOW, model=SCRIPTED), started, events))
            reader.start()
            assert started.wait(30)
            # Queued behind the stream (the scripted model plays one at a time): admitted, not
            # yet generating at the signal, and still run to its end.
            task = create_task(c, body(SLOW, model=SCRIPTED))
            signalled = time.monotonic()
            srv.proc.send_signal(signal.SIGTERM)
            assert _wait_ready(srv.url, 503, timeout=5) == {"status": "not_ready", "reasons": ["draining"]}
            assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
            for path, payload in NEW_WORK:
                r = httpx.post(f"{srv.url}{path}", json=payload, timeout=30)  # each face's own error shape
                assert r.status_code == 503, (path, r.text)
                assert r.headers["retry-after"] == "2", path
                assert r.headers["connection"] == "close", path
            assert_problem(c.post(URL, json=body("x", model=SCRIPTED)), 503, "service_unavailable")
            # Reads go on: the task created before the signal, to its end.
            _, raw = read_task_events(c, task["id"])
        reader.join(30)
        assert events[-1][0] == "response.completed"
        assert _text(events) == ANSWER
        task_events = parse_events(raw)
        assert task_events[-1][1] == "response.completed"
        assert [i for i, _, _ in task_events] == list(range(1, len(task_events) + 1))
        assert srv.proc.wait(30) == 0
        # It waited for its runs (3 s of tokens each, one after the other), not for the 30 s deadline.
        assert time.monotonic() - signalled < 20
    finally:
        srv.stop()


@pytest.mark.parametrize("how", ["second signal", "deadline"])
def test_drain_ends_at_a_second_signal_or_the_deadline(tmp_path: Path, how: str) -> None:
    srv = _server(tmp_path, "--drain-timeout", "60" if how == "second signal" else "1")
    try:
        events: list[Any] = []
        started = threading.Event()
        long = body("!slow 100 !repeat w", model=SCRIPTED, max_output_tokens=600)  # 60 s
        reader = threading.Thread(target=_read_stream, args=(srv.url, long, started, events))
        reader.start()
        assert started.wait(30)
        srv.proc.send_signal(signal.SIGTERM)
        _wait_ready(srv.url, 503, timeout=5)
        signalled = time.monotonic()
        if how == "second signal":
            srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(30) == 0
        assert time.monotonic() - signalled < 10
        reader.join(30)
        # As a stop without a drain: the stream's end says the service went away.
        assert events[-1][0] == "error"
    finally:
        srv.stop()


@pytest.fixture
def shared_servers() -> Iterator[tuple[Any, str]]:
    why = missing_servers()
    if why is not None:
        pytest.skip(why)
    with redis_process() as redis, postgres_server() as postgres_url:
        yield redis, postgres_url


def test_not_ready_while_redis_or_postgres_is_away(tmp_path: Path, shared_servers: tuple[Any, str]) -> None:
    redis, postgres_url = shared_servers
    srv = _server(tmp_path, "--store", postgres_url, "--events", redis.url)
    try:
        assert _ready(srv.url) == (200, {"status": "ready"})
        redis.proc.terminate()  # gone: every command fails at once
        assert _wait_ready(srv.url, 503, 10) == {"status": "not_ready", "reasons": ["events_unreachable"]}
        assert httpx.get(f"{srv.url}/health", timeout=10).status_code == 200
        redis.restart()
        _wait_ready(srv.url, 200, 10)

        stopped = postgres_pids(postgres_url)
        for pid in stopped:  # stalled: a request waits out its deadline (5 s) before its 503
            os.kill(pid, signal.SIGSTOP)
        try:
            frozen = time.monotonic()
            assert _wait_ready(srv.url, 503, 20) == {"status": "not_ready", "reasons": ["store_unreachable"]}
            assert time.monotonic() - frozen > 4  # not at the first slow answer: past the bounded wait
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        _wait_ready(srv.url, 200, 20)
    finally:
        srv.stop()
