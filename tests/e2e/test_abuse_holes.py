"""Issue 28's small holes, each with the request that got a 500 or slipped a limit before: strict
numeric query parameters, nothing raw in the log, `instructions` counted, schema depth on every
face, a total deadline for a body, and no return to tokenless mode when the last token goes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import SCRIPTED, assert_problem, body, checked_client, read_until
from lmsp.client import Client, NotFound
from lmsp.testing import RunningServer, start_server


@pytest.fixture(scope="module")
def tight(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        tmp_path_factory.mktemp("tight"),
        "--scripted-model", SCRIPTED, "--max-input-chars", "300", "--max-schema-depth", "6",
        "--body-timeout", "1", "--body-deadline", "2",
    )  # fmt: skip
    yield srv
    srv.stop()


def _openai_error(r: httpx.Response, status: int, code: str, param: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["param"] == param, error


def _deep(levels: int) -> Any:
    """A schema whose JSON nests 2 * levels + 1 deep."""
    value: Any = {"type": "string"}
    for _ in range(levels):
        value = {"type": "object", "properties": {"a": value}}
    return value


# --- numeric query parameters ---------------------------------------------------------------


@pytest.mark.parametrize("value", ["%C2%B2", "%D9%A3", "-1", "1e3", "", "0", "101", "9" * 30])
def test_input_items_limit_is_strict(tight, value):
    # `²`.isdigit() is True and int("²") raises: this was a 500.
    with checked_client(tight.url) as c:
        r = c.get(f"/v1/responses/resp_x/input_items?limit={value}")
    _openai_error(r, 400, "invalid_request", "limit")


def test_starting_after_and_task_after_are_strict(tight):
    with checked_client(tight.url) as c:
        _openai_error(
            c.get("/v1/responses/resp_x?stream=true&starting_after=%C2%B2"), 400, "invalid_request", "starting_after"
        )
        assert_problem(c.get("/lmsp/v1/tasks/task_x/events?after=%C2%B2"), 400, "invalid_request", "after")
        r = c.get("/lmsp/v1/tasks/task_x/events", headers={"last-event-id": "1e3"})
        assert_problem(r, 400, "invalid_request", "Last-Event-ID")


def test_a_path_reaches_the_log_escaped(tight):
    # The path is decoded before it is logged: CR, LF and ESC in it could forge or recolour lines.
    with checked_client(tight.url) as c:
        r = c.get("/v1/responses/x%0d%0aFORGED%1b%5b31m/input_items?limit=%C2%B2")
        assert r.status_code in (400, 404), r.text
    time.sleep(0.3)
    log = tight.log_path.read_bytes()
    assert b"\x1b" not in log
    assert not any(line.startswith(b"FORGED") for line in log.splitlines())
    assert b"Traceback" not in log


# --- limits on what a request asks for ------------------------------------------------------


def test_instructions_count_toward_max_input_chars(tight):
    with checked_client(tight.url) as c:
        r = c.post("/v1/responses", json={"model": SCRIPTED, "input": "hi", "instructions": "x" * 400})
        _openai_error(r, 400, "limit_exceeded", "input")
        assert (
            c.post("/v1/responses", json={"model": SCRIPTED, "input": "hi", "instructions": "x" * 50}).status_code
            == 200
        )


def test_schema_depth_on_every_face(tight):
    deep = _deep(3)  # 7 levels; --max-schema-depth 6
    fn = {"type": "function", "name": "f", "parameters": deep}
    with checked_client(tight.url) as c:
        text_format = {"format": {"type": "json_schema", "name": "x", "schema": deep}}
        r = c.post("/v1/responses", json={"model": SCRIPTED, "input": "hi", "text": text_format})
        _openai_error(r, 400, "limit_exceeded", "text.format.schema")
        r = c.post("/v1/responses", json={"model": SCRIPTED, "input": "hi", "tools": [fn]})
        _openai_error(r, 400, "limit_exceeded", "tools[0].parameters")
        chat = {"model": SCRIPTED, "messages": [{"role": "user", "content": "hi"}]}
        tool = {"type": "function", "function": {"name": "f", "parameters": deep}}
        r = c.post("/v1/chat/completions", json={**chat, "tools": [tool]})
        _openai_error(r, 400, "limit_exceeded", "tools[0].function.parameters")
        form = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep}}
        r = c.post("/v1/chat/completions", json={**chat, "response_format": form})
        _openai_error(r, 400, "limit_exceeded", "response_format.json_schema.schema")
        r = c.post("/lmsp/v1/responses", json=body("hi", model=SCRIPTED, tools=[fn]))
        assert_problem(r, 400, "limit_exceeded", "tools[0].parameters")
        shallow = {**fn, "parameters": _deep(2)}
        r = c.post("/v1/responses", json={"model": SCRIPTED, "input": "hi", "tools": [shallow]})
        assert r.json()["error"]["code"] == "unsupported_capability", r.text  # past the limits


# --- a body's total deadline ----------------------------------------------------------------


def test_a_trickled_body_is_408_at_the_deadline(tight):
    # One byte every 0.4 s never trips the 1 s pause limit; the 2 s deadline ends it.
    with socket.create_connection(("127.0.0.1", tight.port)) as sock:
        sock.settimeout(10)
        start = time.monotonic()
        sock.sendall(
            b"POST /lmsp/v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        answer = b""
        for _ in range(20):
            try:
                sock.sendall(b" ")
            except OSError:
                break
            sock.settimeout(0.4)
            try:
                answer += sock.recv(65536)
            except TimeoutError:
                continue
            if answer:
                break
        sock.settimeout(5)
        answer += read_until(sock, b"}") if b"}" not in answer else b""
        elapsed = time.monotonic() - start
    assert answer.startswith(b"HTTP/1.1 408") and b"whole within 2 s" in answer, answer
    assert 1.8 < elapsed < 4


# --- tokens -------------------------------------------------------------------------------


def _lmsp(data_dir: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "lmsp", *args, "--data-dir", str(data_dir)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_revoking_the_last_token_does_not_reopen_the_service(tmp_path):
    data_dir = tmp_path / "data"
    token = _lmsp(data_dir, "token", "create", "--scopes", "models:read", "--name", "only")
    server = start_server(tmp_path, "--data-dir", str(data_dir), "--scripted-model", SCRIPTED)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert c.get("/lmsp/v1/models").status_code == 401
            assert c.get("/lmsp/v1/models", headers={"authorization": f"Bearer {token}"}).status_code == 200
            _lmsp(data_dir, "token", "revoke", "only")
            assert_problem(c.get("/lmsp/v1/models"), 401, "authentication_required", "Authorization")
            r = c.get("/lmsp/v1/models", headers={"authorization": f"Bearer {token}"})
            assert_problem(r, 401, "invalid_token", "Authorization")
    finally:
        server.stop()


def test_the_client_sends_a_task_id_as_one_segment(tight):
    # `../models` unencoded reached GET /lmsp/v1/models, whose list no Task can be read from.
    with Client(tight.url) as client:
        with pytest.raises(NotFound):
            client.tasks.get("../models")
        with pytest.raises(NotFound):
            client.responses.get("x/../../models")


def test_delete_removes_a_background_response_from_its_live_task(tight):
    # Before: GET read the live task's projection first, and still returned the content.
    with checked_client(tight.url) as c:
        created = c.post("/v1/responses", json={"model": SCRIPTED, "input": "secret words", "background": True})
        assert created.status_code == 200, created.text
        response_id = created.json()["id"]
        deadline = time.monotonic() + 30
        while c.get(f"/v1/responses/{response_id}").json()["status"] in ("queued", "in_progress"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert "secret" in c.get(f"/v1/responses/{response_id}").text
        assert c.delete(f"/v1/responses/{response_id}").status_code == 200
        gone = c.get(f"/v1/responses/{response_id}")
        assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found"
        r = c.get(f"/v1/responses/{response_id}?stream=true")
        assert r.status_code == 404 and "secret" not in r.text
