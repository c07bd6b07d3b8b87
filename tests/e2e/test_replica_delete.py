"""Issue 28: `DELETE /v1/responses/{id}` on one replica ends a reader already attached to
another replica's copy of the response's events, instead of letting it read on until it
disconnects. Two real `lmsp serve` replicas sharing a real PostgreSQL store and a real Redis
event log; the reader on B is a socket that stops reading, so B holds it mid-way."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import SCRIPTED, TASKS, body, checked_client, create_task, wait_final
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import missing_servers, postgres_server, redis_server

pytestmark = pytest.mark.skipif(missing_servers() is not None, reason=str(missing_servers()))

# A stored response of 6,000 words of 1,000 bytes: ~6.5 MB of events, then a final event that
# holds them all, within the ring's 16 MiB; more than B's buffer and the kernel's send buffer
# (up to 4 MiB on loopback) hold for a reader that stops.
EVENTS = 6_000
WORD = "secret" + "x" * 994
BUFFER = 64 * 1024


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, RunningServer]]:
    with redis_server() as redis_url, postgres_server() as postgres_url:
        started: list[RunningServer] = []
        try:
            for name in ("a", "b"):
                workdir: Path = tmp_path_factory.mktemp(f"delete-{name}")
                started.append(
                    start_server(
                        workdir,
                        "--store",
                        postgres_url,
                        "--events",
                        redis_url,
                        "--scripted-model",
                        SCRIPTED,
                        "--max-stream-buffer",
                        str(BUFFER),
                        "--stream-write-timeout",
                        "60",
                    )  # fmt: skip
                )
            yield started[0], started[1]
        finally:
            for server in started:
                server.stop()


def _stalled_reader(port: int, task_id: str) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.connect(("127.0.0.1", port))
    sock.sendall(f"GET {TASKS}/{task_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    assert sock.recv(12) == b"HTTP/1.1 200", "the stream did not start"
    return sock


def _read_to_end(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    seen = b""
    while chunk := sock.recv(65536):
        seen += chunk
        if b"event: error" in seen and seen.endswith(b"\n\n"):
            break
    return seen


def test_delete_on_a_ends_a_reader_attached_to_bs_copy(replicas: tuple[RunningServer, RunningServer]) -> None:
    a, b = replicas
    with checked_client(a.url) as ca:
        task = create_task(ca, body(f"!repeat {WORD}", model=SCRIPTED, store=True, max_output_tokens=EVENTS))
        final = wait_final(ca, task["id"], timeout=120)
        assert final["status"] == "incomplete"  # max_output_tokens: all of them generated
        reader = _stalled_reader(b.port, task["id"])
        try:
            time.sleep(1.0)  # B's copy is read and the reader stalls behind its buffer
            deleted = ca.delete(f"/v1/responses/{final['response_id']}")
            assert deleted.status_code == 200, deleted.text
            time.sleep(0.5)  # the notice reaches B
            started = time.monotonic()
            rest = _read_to_end(reader, timeout=30)
            took = time.monotonic() - started
        finally:
            reader.close()
    # It ends with event_history_expired after at most what B had handed over before the
    # DELETE (its buffer and the kernel's), not the whole response: before, it read on to the
    # final event.
    assert b"event_history_expired" in rest, rest[-500:]
    assert b"deleted with their response" in rest, rest[-500:]  # not "read too slowly"
    assert b"response.incomplete" not in rest
    words = rest.count(b"secret")
    assert words < EVENTS, f"read all {words} words after the DELETE"
    print(f"\nB's reader got {words} of {EVENTS} words ({len(rest)} bytes), ended {took:.2f} s after it read again")


def test_delete_on_b_forgets_the_task_a_ran(replicas: tuple[RunningServer, RunningServer]) -> None:
    # A keeps a task it ran in memory for its event retention; a DELETE through B must not
    # leave A answering with the content.
    a, b = replicas
    with checked_client(a.url) as ca, checked_client(b.url) as cb:
        task = create_task(ca, body("secret words", model=SCRIPTED, store=True))
        final = wait_final(ca, task["id"])
        assert ca.get(f"{TASKS}/{task['id']}").status_code == 200
        assert cb.delete(f"/v1/responses/{final['response_id']}").status_code == 200
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and ca.get(f"{TASKS}/{task['id']}").status_code != 404:
            time.sleep(0.05)
        for client in (ca, cb):
            gone = client.get(f"{TASKS}/{task['id']}")
            assert gone.status_code == 404 and "secret" not in gone.text
            assert client.get(f"/v1/responses/{final['response_id']}").status_code == 404
            events = client.get(f"{TASKS}/{task['id']}/events")
            assert events.status_code == 404 and "secret" not in events.text
