"""Shared by the test modules: request bodies and reading event streams."""

from __future__ import annotations

import re
import select
import socket
import subprocess
import sys
import threading
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

import httpx
import orjson
from pydantic_core import SchemaValidator

from lmsp.client import iter_events
from lmsp.engine.sequence import FinishReason
from lmsp.protocol.errors import PROBLEM
from lmsp.protocol.events import EVENT_DATA
from lmsp.protocol.models import MODEL as MODEL_SCHEMA
from lmsp.protocol.models import MODEL_LIST
from lmsp.protocol.responses import RESPONSE
from lmsp.protocol.tasks import TASK
from lmsp.security.scopes import parse_scopes
from lmsp.tokens.sqlite import TokenStore

MODEL = "smollm2:135m-instruct-q4_1"
SCRIPTED = "scripted:test"
ULID = r"[0-9A-HJKMNP-TV-Z]{26}"


# What the service sends is checked against the same schemas that the OpenAPI document and
# the request validator come from: a field we add, drop or mistype fails every test that sees it.
_RESPONSE = SchemaValidator(RESPONSE)
_PROBLEM = SchemaValidator(PROBLEM)
_TASK = SchemaValidator(TASK)
_MODEL = SchemaValidator(MODEL_SCHEMA)
_MODEL_LIST = SchemaValidator(MODEL_LIST)
_EVENTS = {name: SchemaValidator(schema) for name, schema in EVENT_DATA.items()}


def check_event(name: str, data: Any) -> None:
    _EVENTS[name].validate_python(data)


def check_against_protocol(response: httpx.Response) -> None:
    """An httpx response hook: every JSON body the service sends must fit its schema."""
    kind = response.headers.get("content-type", "")
    if kind == "text/event-stream":
        return  # events are checked one by one where they are read (`stream`)
    response.read()
    if response.status_code == 204:  # a task resumed after its final event: nothing to check
        assert response.content == b"" and "content-type" not in response.headers
        return
    if kind == "application/problem+json":
        _PROBLEM.validate_json(response.content)
        return
    assert kind == "application/json", kind
    path = response.request.url.path
    if path.startswith("/lmsp/v1/responses") and response.status_code == 200:
        _RESPONSE.validate_json(response.content)
    elif path.startswith("/lmsp/v1/tasks"):
        _TASK.validate_json(response.content)
    elif path == "/lmsp/v1/models":
        _MODEL_LIST.validate_json(response.content)
    elif path.startswith("/lmsp/v1/models/"):
        _MODEL.validate_json(response.content)


def checked_client(url: str, timeout: float = 120) -> httpx.Client:
    return httpx.Client(base_url=url, timeout=timeout, event_hooks={"response": [check_against_protocol]})


def user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


def body(text: str, model: str = MODEL, **fields: Any) -> dict[str, Any]:
    return {"model": model, "input": user(text), **fields}


def has_id(value: str, prefix: str) -> bool:
    return re.fullmatch(f"{prefix}_{ULID}", value) is not None


def stream(client: httpx.Client, payload: dict[str, Any]) -> tuple[httpx.Response, list[tuple[int, str, Any]]]:
    """POSTs a streaming request; returns the response and its events as (id, name, data)."""
    with client.stream("POST", "/lmsp/v1/responses", json={**payload, "stream": True}) as response:
        if response.status_code != 200:
            response.read()
            return response, []
        events = [(int(e.id), e.event, orjson.loads(e.data)) for e in iter_events(response.iter_bytes())]
    for _, name, data in events:
        check_event(name, data)
    return response, events


def assert_problem(response: httpx.Response, status: int, code: str, param: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.headers["lmsp-version"] == "1.0"
    doc: dict[str, Any] = response.json()
    assert doc["type"] == f"urn:lmsp:error:{code}"
    assert doc["code"] == code
    assert doc["status"] == status
    assert doc["title"] and doc["detail"]
    if param is not None:
        assert doc["param"] == param
    assert "Traceback" not in response.text
    return doc


def send_post(sock: socket.socket, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    """Writes `POST /lmsp/v1/responses` by hand, for tests that must control the socket."""
    data = orjson.dumps(payload)
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    sock.sendall(
        b"POST /lmsp/v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"{extra}Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    """Everything the server sent up to and including `marker`."""
    seen = b""
    while marker not in seen:
        chunk = sock.recv(65536)
        assert chunk, "server closed early"
        seen += chunk
    return seen


def raw_stream_then_close(port: int, payload: dict[str, Any], marker: bytes) -> bytes:
    """Starts a stream on a raw socket, reads until `marker` appears, then vanishes."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        send_post(sock, {**payload, "stream": True})
        return read_until(sock, marker)


# A sync request shows nothing until it ends. To know that one is in the service (its body
# read, its key claimed, submitted to its model), send it twice with one Idempotency-Key: the
# copy that loses the key is answered 409 at once, and the other is then the one that runs.


def sync_behind_a_duplicate(url: str, payload: dict[str, Any]) -> tuple[httpx.Response, Future[httpx.Response]]:
    """(the 409 answer, the running request's answer to come)."""
    key = str(uuid.uuid4())
    pool = ThreadPoolExecutor(2)

    def post() -> httpx.Response:
        with checked_client(url, timeout=60) as c:
            return c.post("/lmsp/v1/responses", json=payload, headers={"Idempotency-Key": key})

    both = [pool.submit(post), pool.submit(post)]
    pool.shutdown(wait=False)
    done, _ = wait(both, timeout=60, return_when=FIRST_COMPLETED)
    assert done, "neither copy was answered"
    [first] = done
    return first.result(), both[1] if first is both[0] else both[0]


def raw_sync_behind_a_duplicate(port: int, payload: dict[str, Any]) -> tuple[bytes, socket.socket]:
    """The same on raw sockets: (the head of the 409 answer, the connection of the one that
    runs), for a test that then makes that client vanish."""
    key = str(uuid.uuid4())
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]
    for sock in socks:
        send_post(sock, payload, {"Idempotency-Key": key})
    ready, _, _ = select.select(socks, [], [], 60)
    assert ready, "neither copy was answered"
    loser = ready[0]
    head = read_until(loser, b"\r\n\r\n")
    loser.close()
    return head, socks[1] if loser is socks[0] else socks[0]


TASKS = "/lmsp/v1/tasks"
KEEPALIVE = b": keep-alive\n\n"


def create_task(client: httpx.Client, payload: dict[str, Any], headers: dict[str, str] | None = None) -> dict[str, Any]:
    created = client.post(TASKS, json=payload, headers=headers)
    assert created.status_code == 202, created.text
    task: dict[str, Any] = created.json()
    assert created.headers["location"] == f"{TASKS}/{task['id']}"
    return task


def read_task_events(client: httpx.Client, task_id: str, **params: Any) -> tuple[httpx.Response, bytes]:
    """GETs a task's events (`after=`, `last_event_id=`); the status and the whole body with
    keep-alive comments (timing, not content) taken out."""
    headers = {}
    if "last_event_id" in params:
        headers["last-event-id"] = str(params.pop("last_event_id"))
    with client.stream("GET", f"{TASKS}/{task_id}/events", params=params, headers=headers) as response:
        raw = response.read()
    return response, raw.replace(KEEPALIVE, b"")


def parse_events(raw: bytes) -> list[tuple[int, str, Any]]:
    events = [(int(e.id), e.event, orjson.loads(e.data)) for e in iter_events([raw])]
    for _, name, data in events:
        check_event(name, data)
    return events


def wait_final(client: httpx.Client, task_id: str, timeout: float = 30) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        task: dict[str, Any] = client.get(f"{TASKS}/{task_id}").json()
        if task["response"] is not None:
            return task
        time.sleep(0.02)
    raise AssertionError(f"task {task_id} did not end within {timeout} s")


def make_token(data_dir: Path, scopes: str, name: str | None = None) -> str:
    """A token with these comma-separated scopes (and `name`), made in `data_dir`'s store as
    `lmsp token create` does; returns its secret."""
    tokens = TokenStore(data_dir)
    try:
        return tokens.create(parse_scopes(scopes), name)[0]
    finally:
        tokens.close()


class TextSink:
    """A generation's sink for tests that drive the scheduler: its text, how it ended, its
    error; `ended` is set either way."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.ended = threading.Event()
        self.reason: FinishReason | None = None
        self.error: str | None = None

    def on_text(self, text: str) -> None:
        self.text.append(text)

    def on_finish(self, reason: FinishReason, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> None:
        self.reason = reason
        self.ended.set()

    def on_error(self, message: str) -> None:
        self.error = message
        self.ended.set()


def assert_old_task_records_have_their_bounds(store: Any) -> None:
    """Three task records written before their columns existed (issue 38: `task_<n>` of owner
    `o`, created at 1,000 + n, carrying `resp_<n>`), once the store upgraded the file: found by
    response, by age and by size, as new ones are."""
    assert store.response_tasks("o", "resp_1") == ["task_1"]
    assert store.expire_responses(1_001) == 1
    assert store.get_task("o", "task_0") is None
    assert store.trim_task_bytes("o", 1) == 1  # sizes were filled: the older of two goes
    assert store.get_task("o", "task_1") is None
    assert store.delete_response("o", "resp_2") is True
    assert store.get_task("o", "task_2") is None


# What a client of generation routes needs: list models, create and read responses.
GENERATION_SCOPES = "models:read,responses:write,responses:read"


def store_token(store: str, name: str, *args: str, scopes: str = GENERATION_SCOPES) -> str:
    """A token made with `lmsp token create` in the shared store at `store` (a replica fleet's)."""
    made = subprocess.run(
        [sys.executable, "-m", "lmsp", "token", "create", "--store", store, "--scopes", scopes, "--name", name, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()
