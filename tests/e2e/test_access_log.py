"""The access log: one line per request when it ends (a cut stream's too), in text and JSON,
with what a client sent escaped: no control character reaches the log file raw."""

from __future__ import annotations

import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from helpers import MODEL, SCRIPTED, assert_problem, body, checked_client, make_token, read_until, send_post, stream
from lmsp.testing import RunningServer, start_server

# ESC and a terminal's "clear screen", CR LF and a forged line, a C1 CSI, DEL, a right-to-left
# override: what a client could send to rewrite what an operator reads.
HOSTILE = "evil\x1b[2J\r\n2026-01-01T00:00:00.000Z GET /forged 200\x9b31m\x7f\u202e"
# Anything but printable text, tab aside: C0 (newline is the line's end), DEL, C1 (as UTF-8).
_RAW_CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]|\xe2\x80[\xa8-\xae]")


def access_lines(server: RunningServer) -> list[bytes]:
    """The server's access lines (stdout and stderr share the file; its banner lines do not
    start with a timestamp)."""
    return [
        line for line in server.log_path.read_bytes().splitlines() if re.match(rb"\{\"time\"|\d{4}-\d\d-\d\dT", line)
    ]


def wait_lines(server: RunningServer, n: int, timeout: float = 30) -> list[bytes]:
    """The first `n` access lines, once written (a thread of its own writes them)."""
    deadline = time.monotonic() + timeout
    while len(lines := access_lines(server)) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(lines) >= n, lines
    return lines


def startup_lines(server: RunningServer) -> int:
    """How many access lines start_server's probes left: `GET /ready` while the model loaded,
    then one `GET /lmsp/v1/models`, the last."""
    deadline = time.monotonic() + 30
    while True:
        lines = access_lines(server)
        if any(b"/lmsp/v1/models" in line for line in lines):
            return len(lines)
        assert time.monotonic() < deadline, lines
        time.sleep(0.05)


def cut_stream(port: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    """A stream the client leaves once its first text delta arrived."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        send_post(sock, {**payload, "stream": True}, headers)
        read_until(sock, b"response.output_text.delta")


@pytest.fixture(scope="module")
def json_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    work = tmp_path_factory.mktemp("access-json")
    token = make_token(work / "data", "models:read,responses:write,responses:read")
    srv = start_server(work, "--data-dir", str(work / "data"), "--log-format", "json", "--scripted-model", SCRIPTED)
    yield srv, token
    srv.stop()


@pytest.mark.model
def test_json_lines_one_per_request_escaped(json_server):
    server, token = json_server
    auth = {"authorization": f"Bearer {token}"}
    start = startup_lines(server)
    with checked_client(server.url) as c:
        c.headers.update(auth)
        assert c.get("/lmsp/v1/models").status_code == 200
        sync = c.post("/lmsp/v1/responses", json=body("Say hello.", max_output_tokens=5, temperature=0))
        assert sync.status_code == 200
        assert_problem(c.get("/lmsp/v1/models/%1b[31mred%07%c2%9b%0d%0aforged"), 404, "model_not_found")
        assert_problem(c.post("/lmsp/v1/responses", json=body("hi", model=HOSTILE)), 404, "model_not_found", "model")
        r, events = stream(c, body("one two three", model=SCRIPTED))
        assert r.status_code == 200
    assert httpx.get(f"{server.url}/lmsp/v1/models").status_code == 401
    cut_stream(server.port, body("Tell me a long story about a ship.", max_output_tokens=200), auth)
    made = 7
    lines = wait_lines(server, start + made)
    time.sleep(0.5)  # a line too many would have come by now
    lines = access_lines(server)
    assert len(lines) == start + made
    raw = server.log_path.read_bytes()
    assert not _RAW_CONTROL.search(raw), _RAW_CONTROL.search(raw)
    assert token.encode() not in raw and token[13:].encode() not in raw  # never the secret

    models, sync_line, path_404, model_404, streamed, unauthorized, cut = (orjson.loads(line) for line in lines[start:])
    assert set(models) == {
        "time", "method", "path", "status", "duration_ms", "model", "input_tokens", "output_tokens", "ttft_ms", "token",
    }  # fmt: skip
    assert models["method"] == "GET" and models["path"] == "/lmsp/v1/models" and models["status"] == 200
    assert models["token"] == token[5:13]  # the token's id, which `lmsp token list` shows
    usage = sync.json()["usage"]
    assert sync_line["model"] == MODEL and sync_line["status"] == 200
    assert (sync_line["input_tokens"], sync_line["output_tokens"]) == (usage["input_tokens"], usage["output_tokens"])
    assert 0 < sync_line["ttft_ms"] <= sync_line["duration_ms"]
    assert path_404["path"] == "/lmsp/v1/models/\\x1b[31mred\\x07\\x9b\\x0d\\x0aforged"
    assert path_404["status"] == 404
    assert model_404["model"] == "evil\\x1b[2J\\x0d\\x0a2026-01-01T00:00:00.000Z GET /forged 200\\x9b31m\\x7f\\u202e"
    assert streamed["model"] == SCRIPTED and streamed["status"] == 200
    assert unauthorized["status"] == 401 and unauthorized["token"] is None
    # Written when the client went: what it had been sent, and how long that took.
    assert cut["status"] == 200 and cut["model"] == MODEL
    assert 1 <= cut["output_tokens"] < 200 and cut["ttft_ms"] is not None


@pytest.fixture(scope="module")
def text_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("access-text"), "--scripted-model", SCRIPTED)
    yield srv
    srv.stop()


_TEXT_LINE = re.compile(
    r'(?P<time>\S+) (?P<method>\S+) (?P<path>"(?:[^"\\]|\\.)*"|\S+) (?P<status>\d{3}|-) (?P<duration>[\d.]+)ms '
    r'model=(?P<model>"(?:[^"\\]|\\.)*"|\S+) in=(?P<input>\d+|-) out=(?P<output>\d+|-) '
    r"ttft=(?P<ttft>[\d.]+ms|-) token=(?P<token>\S+)"
)


@pytest.mark.model
def test_text_lines_one_per_request_escaped(text_server):
    server = text_server
    start = startup_lines(server)
    with checked_client(server.url) as c:
        sync = c.post("/lmsp/v1/responses", json=body("Say hello.", max_output_tokens=4, temperature=0))
        assert sync.status_code == 200
        assert_problem(c.get('/lmsp/v1/a b%1b%0a%5c"x'), 404, "not_found")
        assert_problem(c.post("/lmsp/v1/responses", json=body("hi", model=HOSTILE)), 404, "model_not_found", "model")
    cut_stream(server.port, body("!slow 100 a b c d e f g h i j k l m n o p", model=SCRIPTED))
    made = 4
    wait_lines(server, start + made)
    time.sleep(0.5)
    lines = access_lines(server)
    assert len(lines) == start + made
    raw = server.log_path.read_bytes()
    assert not _RAW_CONTROL.search(raw), _RAW_CONTROL.search(raw)
    parsed = [_TEXT_LINE.fullmatch(line.decode()) for line in lines[start:]]
    assert all(parsed), lines[start:]
    sync_line, path_404, model_404, cut = (m.groupdict() for m in parsed if m)
    usage = sync.json()["usage"]
    assert sync_line["method"] == "POST" and sync_line["path"] == "/lmsp/v1/responses" and sync_line["status"] == "200"
    assert (sync_line["model"], int(sync_line["input"]), int(sync_line["output"])) == (
        MODEL, usage["input_tokens"], usage["output_tokens"],
    )  # fmt: skip
    assert sync_line["ttft"] != "-" and sync_line["token"] == "-"
    # Quoted for its space; the backslash the client sent doubled, so no escape can be forged.
    assert path_404["path"] == '"/lmsp/v1/a b\\x1b\\x0a\\\\\\"x"'
    assert model_404["model"] == '"evil\\x1b[2J\\x0d\\x0a2026-01-01T00:00:00.000Z GET /forged 200\\x9b31m\\x7f\\u202e"'
    assert cut["status"] == "200" and cut["model"] == SCRIPTED
