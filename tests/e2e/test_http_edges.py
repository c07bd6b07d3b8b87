"""R9-4: HTTP/1.1 framing as a hostile client writes it, byte for byte on a socket (no client
library would send these). Framing errors answer 400 and close the connection; what the
server underneath decides alone (docs/operations/security.md) is held to closing it.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from helpers import SCRIPTED, body
from lmsp.testing import RunningServer, start_server

PAYLOAD = orjson.dumps(body("hi", model=SCRIPTED, max_output_tokens=2))
JSON_POST = b"POST /lmsp/v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes
    closed: bool  # the server closed the connection after answering


def exchange(port: int, raw: bytes, quiet: float = 3.0) -> Answer:
    """Sends `raw` and reads until the server closes the connection or sends nothing for
    `quiet` seconds (a kept-alive connection): the first answer, and whether it closed."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(quiet)
        sock.sendall(raw)
        seen, closed = b"", False
        try:
            while chunk := sock.recv(65536):
                seen += chunk
            closed = True
        except TimeoutError:
            pass
        except ConnectionResetError:
            closed = True
    head, _, rest = seen.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith("HTTP/1.1 "), seen
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return Answer(int(lines[0].split()[1]), headers, rest[: int(headers.get("content-length", len(rest)))], closed)


def problem(answer: Answer) -> dict[str, str]:
    assert answer.headers["content-type"] == "application/problem+json"
    doc: dict[str, str] = orjson.loads(answer.body)
    assert doc["status"] == answer.status
    return doc


def lmsp(*args: str, data_dir: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "lmsp", *args, "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return done.stdout.strip()


@pytest.fixture(scope="module")
def with_tokens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    work = tmp_path_factory.mktemp("edges")
    token = lmsp("token", "create", "--scopes", "models:read,responses:write", data_dir=work / "data")
    server = start_server(work, "--data-dir", str(work / "data"), "--scripted-model", SCRIPTED)
    yield server, token
    server.stop()


# --- Host -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hosts", [("127.0.0.1", "evil.example"), ("evil.example", "127.0.0.1"), ("localhost", "localhost")]
)
def test_two_host_lines_are_400_and_close(server, hosts):  # covers: R9-4, R10-4
    raw = b"GET /lmsp/v1/models HTTP/1.1\r\n" + b"".join(b"Host: %s\r\n" % h.encode() for h in hosts) + b"\r\n"
    answer = exchange(server.port, raw)
    assert answer.status == 400 and answer.closed
    assert problem(answer)["code"] == "invalid_request" and problem(answer)["param"] == "Host"


def test_two_host_lines_are_400_with_tokens_too(with_tokens):  # covers: R9-4
    server, token = with_tokens
    raw = (
        b"GET /lmsp/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: evil.example\r\n"
        + f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    answer = exchange(server.port, raw)
    assert answer.status == 400 and answer.closed and problem(answer)["param"] == "Host"
    # One Host line, same token: served, on a connection kept open.
    single = exchange(server.port, raw.replace(b"Host: evil.example\r\n", b""), quiet=1)
    assert single.status == 200 and not single.closed


def test_an_absolute_form_target_is_checked_not_the_host_line(server):  # covers: R9-4, R10-4
    # RFC 9112 §3.2.2: the target's authority wins over `Host`, whichever of them is loopback.
    rebound = exchange(
        server.port, b"GET http://evil.example/lmsp/v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", quiet=1
    )
    assert rebound.status == 403 and problem(rebound)["code"] == "host_not_allowed"
    assert "evil.example" in problem(rebound)["detail"]
    target = f"http://127.0.0.1:{server.port}/lmsp/v1/models".encode()
    loopback = exchange(server.port, b"GET " + target + b" HTTP/1.1\r\nHost: evil.example\r\n\r\n", quiet=1)
    assert loopback.status == 200


# --- bodies ---------------------------------------------------------------------------------


def _chunked(data: bytes, after_data: bytes = b"\r\n", end: bytes = b"0\r\n\r\n") -> bytes:
    return JSON_POST + b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n" % len(data) + data + after_data + end


def test_a_well_framed_chunked_body_is_served_and_kept_alive(server):  # covers: R9-4
    answer = exchange(server.port, _chunked(PAYLOAD), quiet=1)
    assert answer.status == 200 and not answer.closed


@pytest.mark.parametrize(
    "raw",
    [
        _chunked(PAYLOAD, after_data=b"XX"),
        _chunked(PAYLOAD, after_data=b"\n"),
        _chunked(PAYLOAD, end=b"0\r\nX-Trailer: 1\r\n\r\n"),
    ],
    ids=["XX-after-data", "bare-LF-after-data", "trailer-section"],
)
def test_bad_chunk_framing_is_400_and_closes(server, raw):  # covers: R9-4
    answer = exchange(server.port, raw)
    assert answer.status == 400 and answer.closed
    assert problem(answer)["code"] == "invalid_request" and problem(answer)["param"] == "Transfer-Encoding"


@pytest.mark.parametrize(
    "lengths",
    [b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n", b"Transfer-Encoding: chunked\r\nContent-Length: %d\r\n"],
    ids=["length-first", "encoding-first"],
)
def test_content_length_with_transfer_encoding_closes_the_connection(server, lengths):  # covers: R9-4
    # The body is read by its chunks alone, as RFC 9112 §6.1 allows, and the connection closes
    # after the answer, as it requires: nothing a proxy read differently can follow on it.
    raw = JSON_POST + lengths % len(PAYLOAD) + b"\r\n" + b"%x\r\n" % len(PAYLOAD) + PAYLOAD + b"\r\n0\r\n\r\n"
    answer = exchange(server.port, raw)
    assert answer.closed and answer.headers.get("connection") == "close"


# --- HTTP/2 ---------------------------------------------------------------------------------


def test_an_http2_preface_is_closed_at_once(server):  # covers: R9-4
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.settimeout(10)
        start = time.monotonic()
        sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        try:
            rest = sock.recv(65536)
        except ConnectionResetError:
            rest = b""
        assert time.monotonic() - start < 3
    assert rest == b""  # closed, without an HTTP/2 SETTINGS frame: the port speaks HTTP/1.1 only
