"""Issue 38: what a stream's reader may make the service hold, on every path.

- Readers that never read of a *completed* task's replay: each used to hold up to the whole
  --max-stream-buffer (the whole replay when it was smaller) until its write deadline; a
  complete log's reader is now bounded at 128 KiB, read from the ring a slice at a time.
- A service listening on every address (0.0.0.0) measures a client that reached it on an
  address other than its own: the kernel is asked for the connection's real local address.
(Chat Completions and Anthropic streams keep their frames only for an Idempotency-Key:
tests/unit/http/test_stream_view.py, where the kept bytes are counted, not the noisier RSS.)
"""

from __future__ import annotations

import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import SCRIPTED, body, checked_client, create_task, make_token, wait_final
from lmsp.testing import RunningServer, start_server

MIB = 1024 * 1024
READERS = 300
REPLAY_TOKENS = 900  # ~1 KiB words, and the text again in the final events: a ~1.9 MB replay


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


_ESTABLISHED = 1
_BYTES_RECEIVED = 128  # offset of tcpi_bytes_received in struct tcp_info (since Linux 4.1)


def tcp_info(sock: socket.socket) -> tuple[int, int]:
    """(TCP state, bytes received): CLOSE_WAIT once the service shut the connection down."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    return info[0], struct.unpack_from("=Q", info, _BYTES_RECEIVED)[0]


def stalled_reader(target: tuple[str, int], path: str, source: str = "127.0.0.1", token: str | None = None):
    """A socket that asks for `path` and never reads: a 4 KiB window, MSS 1460."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1460)
    sock.bind((source, 0))
    sock.connect(target)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\n".encode())
    return sock


def completed_replay(url: str, headers: dict[str, str] | None = None) -> tuple[str, int]:
    """A finished scripted task of ~1.9 MB of events: (its events' path, their bytes)."""
    with checked_client(url) as c:
        c.headers.update(headers or {})
        task = create_task(c, body("!repeat " + "x" * 1000, model=SCRIPTED, max_output_tokens=REPLAY_TOKENS))
        wait_final(c, task["id"], timeout=60)
        path = f"/lmsp/v1/tasks/{task['id']}/events"
        size = len(c.get(path).content)
    assert size > 1.8 * MIB, size
    return path, size


def peak_growth(pid: int, idle: int, seconds: float) -> int:
    peak = idle
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        peak = max(peak, rss(pid))
        time.sleep(0.1)
    return peak - idle


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # The defaults that matter here: --max-stream-buffer 1 MiB, --stream-write-timeout 30 s.
    srv = start_server(
        tmp_path_factory.mktemp("memory"),
        "--scripted-model", SCRIPTED, "--max-output-tokens", "60000", "--parallel", "4",
        "--max-streams", str(READERS + 16),
    )  # fmt: skip
    yield srv
    srv.stop()


def test_readers_that_never_read_a_completed_replay_hold_little(service):
    path, size = completed_replay(service.url)
    time.sleep(0.5)
    idle = rss(service.proc.pid)
    socks = [stalled_reader(("127.0.0.1", service.port), path) for _ in range(READERS)]
    try:
        grown = peak_growth(service.proc.pid, idle, 8)
        served = sum(1 for sock in socks if tcp_info(sock)[1] > 0)
    finally:
        for sock in socks:
            sock.close()
    print(f"\n{READERS} readers of a {size / MIB:.2f} MB replay: RSS +{grown / MIB:.1f} MiB")
    assert served == READERS  # every one was being written to, not queued behind the others
    # Before: +593 MB here (each held the bound, 1 MiB, or the whole replay when smaller).
    assert grown < 150 * MIB


def _global_address() -> str | None:
    """One of this machine's addresses that is not loopback, if it has one."""
    found = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True)
    for line in found.stdout.splitlines():
        return line.split()[3].partition("/")[0]
    return None


WILDCARD_READERS = 60
WRITE_TIMEOUT = 3.0


@pytest.fixture(scope="module")
def wildcard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str, str]]:
    address = _global_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    work = tmp_path_factory.mktemp("wildcard")
    token = make_token(work / "data", "responses:write,responses:read")
    srv = start_server(
        work, "--host", "0.0.0.0", "--data-dir", str(work / "data"), "--scripted-model", SCRIPTED,
        "--max-output-tokens", "5000", "--stream-write-timeout", str(WRITE_TIMEOUT),
        "--max-streams-per-token", str(WILDCARD_READERS + 8),
        "--max-replays-per-token", str(WILDCARD_READERS + 8),
    )  # fmt: skip
    yield srv, address, token
    srv.stop()


def test_a_wildcard_listener_bounds_a_client_that_reached_another_address(wildcard):
    # Served on 0.0.0.0; the readers connect from 127.0.0.1 to the machine's other address, so
    # the connection's local address is neither the listener's nor the client's. Before, such
    # readers went unmeasured: each held what the kernel did not take, and none was ever closed.
    srv, address, token = wildcard
    path, size = completed_replay(srv.url, {"authorization": f"Bearer {token}"})
    time.sleep(0.5)
    idle = rss(srv.proc.pid)
    socks = [stalled_reader((address, srv.port), path, token=token) for _ in range(WILDCARD_READERS)]
    opened = time.monotonic()
    try:
        grown = peak_growth(srv.proc.pid, idle, 2)
        open_socks = list(socks)
        while open_socks and time.monotonic() - opened < WRITE_TIMEOUT + 20:
            open_socks = [sock for sock in open_socks if tcp_info(sock)[0] == _ESTABLISHED]
            grown = max(grown, rss(srv.proc.pid) - idle)
            time.sleep(0.2)
        closed_after = time.monotonic() - opened
    finally:
        for sock in socks:
            sock.close()
    print(
        f"\n{WILDCARD_READERS} readers on {address} of a {size / MIB:.2f} MB replay: RSS +{grown / MIB:.1f} MiB, "
        f"{len(open_socks)} left open after {closed_after:.1f} s"
    )
    assert not open_socks  # the write deadline closed every one: their drain was measured
    assert grown < WILDCARD_READERS * 256 * 1024 + 32 * MIB  # unmeasured: ~1.9 MB each
