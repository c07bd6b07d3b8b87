"""Resuming a task's events over connections that break anywhere (§6.4), and tasks across a
kill -9 (§7: the task is kept durably; one left running is `failed`, never in_progress)."""

from __future__ import annotations

import random
import signal
import socket

from helpers import (
    KEEPALIVE,
    SCRIPTED,
    TASKS,
    body,
    checked_client,
    create_task,
    parse_events,
    read_task_events,
    wait_final,
)
from lmsp._core import SseParser
from lmsp.testing import start_server

CUTS_AT_LEAST = 1000


def _dechunk(data: bytes) -> bytes:
    """The body bytes of a chunked HTTP/1.1 response cut anywhere: every whole or partial
    chunk that arrived, nothing of a chunk-size line cut in half."""
    out = []
    pos = 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            break
        size = int(data[pos:end].split(b";")[0], 16)
        if size == 0:
            break
        out.append(data[end + 2 : end + 2 + size])
        pos = end + 2 + size + 2
        if pos > len(data):
            break
    return b"".join(out)


def _read_cut(port: int, task_id: str, last_event_id: int, cut: int) -> tuple[int, bytes]:
    """GETs the events after `last_event_id` on a raw socket and hangs up after `cut` bytes
    of the HTTP response (or at its end). Returns the status and its body."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(
            (
                f"GET {TASKS}/{task_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\nLast-Event-ID: {last_event_id}\r\n\r\n"
            ).encode()
        )
        seen = b""
        while len(seen) < cut:
            chunk = sock.recv(min(65536, cut - len(seen)))
            if not chunk:
                break
            seen += chunk
            if seen.endswith(b"\r\n0\r\n\r\n") or (seen.startswith(b"HTTP/1.1 204") and b"\r\n\r\n" in seen):
                break  # the server finished: the stream ended, not our cut
    head, _, rest = seen.partition(b"\r\n\r\n")
    status_line, crlf, _ = seen.partition(b"\r\n")
    status = int(status_line.split(b" ", 2)[1]) if crlf else 0
    return status, _dechunk(rest) if b"chunked" in head.lower() else b""


def _complete_frames(body: bytes) -> tuple[bytes, int | None]:
    """The complete frames at the start of `body` (keep-alives taken out), and the id of the
    last complete event, as a client's SSE parser sees them."""
    parser = SseParser()
    events = parser.feed(body)
    whole = body[: body.rfind(b"\n\n") + 2] if events or b"\n\n" in body else b""
    return whole.replace(KEEPALIVE, b""), (int(events[-1].id) if events else None)


def test_reading_over_cut_connections_equals_one_read(server, client):  # covers: R6.4-1, R6.4-2, R7-3
    rng = random.Random(20261130)
    cuts = 0
    for _round in range(3):
        task = create_task(client, body("!repeat tok", model=SCRIPTED, max_output_tokens=2000))
        pieces: list[bytes] = []
        last = 0
        # Start at once: the first cuts land while it still generates, the rest on the replay.
        while True:
            # Mostly short reads (many cuts, mid-frame); some long enough for the big
            # output_item.done frame, which holds the whole text.
            cut = rng.randint(1, 1000) if rng.random() < 0.97 else rng.randint(3000, 20000)
            status, got = _read_cut(server.port, task["id"], last, cut)
            cuts += 1
            if status == 204:
                break
            assert status in (0, 200), status  # 0: cut inside the status line
            whole, last_id = _complete_frames(got)
            if last_id is not None:
                pieces.append(whole)
                last = last_id
            assert cuts < 10_000
        _, uninterrupted = read_task_events(client, task["id"])
        assert b"".join(pieces) == uninterrupted
        events = parse_events(uninterrupted)
        assert events[-1][1] == "response.incomplete" and len(events) == 2000 + 4
    assert cuts >= CUTS_AT_LEAST


def test_tasks_across_a_kill_9(tmp_path):  # covers: R7-1, R7-2, R7-5
    data = tmp_path / "data"
    first = start_server(tmp_path, "--scripted-model", SCRIPTED, "--data-dir", str(data))
    try:
        with checked_client(first.url) as c:
            done = wait_final(c, create_task(c, body("kept for later", model=SCRIPTED))["id"])
            running = create_task(c, body("!slow 500 " + " ".join(["w"] * 40), model=SCRIPTED))
            assert c.get(f"{TASKS}/{running['id']}").json()["status"] == "in_progress"
            first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
    finally:
        first.stop()

    second = start_server(tmp_path, "--scripted-model", SCRIPTED, "--data-dir", str(data))
    try:
        with checked_client(second.url) as c:
            assert c.get(f"{TASKS}/{done['id']}").json() == done
            failed = c.get(f"{TASKS}/{running['id']}").json()
            assert failed["status"] == "failed" and failed["response"]["status"] == "failed"
            assert failed["response"]["id"] == running["response_id"]
            assert failed["response"]["error"]["code"] == "generation_failed"
            # its events died with the process; the task says how it ended
            assert c.get(f"{TASKS}/{running['id']}/events").status_code == 410
            assert c.post(f"{TASKS}/{running['id']}/cancel").json() == failed
    finally:
        second.stop()
