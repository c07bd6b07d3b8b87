"""Embeddings within bounds (issue 38): a request's inputs are counted and their tokens summed
against `--max-embedding-inputs` and `--max-embedding-tokens`, a 400 naming the field on every
face; and a client that hangs up stops its work, counted by the engine itself
(`lmsp_embedding_inputs_total{result="embedded"|"cancelled"}`), not timed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import MODEL
from lmsp.testing import RunningServer, start_server

WINDOW = 512  # tokens one embedding input may have (engine/scheduler.py EMBEDDING_WINDOW)
# The three faces that take many inputs, and how each writes a request of token-id inputs.
MANY = {
    "/lmsp/v1/embeddings": lambda inputs: {"model": MODEL, "input": inputs},
    "/v1/embeddings": lambda inputs: {"model": MODEL, "input": inputs, "encoding_format": "float"},
    "/api/embed": lambda inputs: {"model": MODEL, "input": inputs},
}


def _param(response: httpx.Response) -> tuple[int, str | None, str]:
    """(status, param, detail) from a problem document, OpenAI's error object or Ollama's."""
    doc = response.json()
    if isinstance(doc.get("error"), str):  # Ollama's {"error": message, "param": field}
        return response.status_code, doc.get("param"), doc["error"]
    error = doc["error"] if isinstance(doc.get("error"), dict) else doc
    return response.status_code, error.get("param"), error.get("detail") or error.get("message") or ""


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        tmp_path_factory.mktemp("embed-bounds"),
        *("--max-embedding-inputs", "2", "--max-embedding-tokens", "16", "--keep-alive", "-1"),
    )
    yield srv
    srv.stop()


def test_each_face_names_the_field_past_the_embedding_bounds(bounded):
    with httpx.Client(base_url=bounded.url, timeout=120) as c:
        for path, request in MANY.items():
            r = c.post(path, json=request([[42] * 8, [43] * 8]))  # 2 inputs, 16 tokens: within both
            assert r.status_code == 200, (path, r.text)
            status, param, detail = _param(c.post(path, json=request([[42]] * 3)))
            assert (status, param) == (400, "input") and "--max-embedding-inputs" in detail, (path, detail)
            status, param, detail = _param(c.post(path, json=request([[42] * 9, [43] * 8])))
            assert (status, param) == (400, "input") and "--max-embedding-tokens" in detail, (path, detail)
        # Ollama's older route takes one prompt, cut to the window: only the tokens can be too many.
        r = c.post("/api/embeddings", json={"model": MODEL, "prompt": "word " * 40})
        status, param, detail = _param(r)
        assert (status, param) == (400, "prompt") and "--max-embedding-tokens" in detail, r.text
        assert c.post("/api/embeddings", json={"model": MODEL, "prompt": "cat"}).status_code == 200


def test_the_default_token_bound_holds_below_the_input_count(client):
    # 129 window-length inputs are within 256 inputs but past 65,536 tokens: refused before any
    # is decoded (they would hold the model's thread for 129 decodes).
    r = client.post("/lmsp/v1/embeddings", json={"model": MODEL, "input": [[42] * WINDOW] * 129})
    status, param, detail = _param(r)
    assert (status, param) == (400, "input") and "--max-embedding-tokens" in detail, r.text


def _counts(url: str) -> dict[str, float]:
    """The model's counters: prompt tokens decoded, embedding inputs embedded and cancelled."""
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = {"decoded": 0.0, "embedded": 0.0, "cancelled": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.labels.get("model") != MODEL:
                continue
            if s.name == "lmsp_prompt_tokens_total" and s.labels["source"] == "decoded":
                found["decoded"] = s.value
            elif s.name == "lmsp_embedding_inputs_total":
                found[s.labels["result"]] = s.value
    return found


@pytest.mark.parametrize("path", list(MANY))
def test_a_client_that_hangs_up_stops_its_inputs(server, path):
    n = 16  # one decode each: a window-length input fills the embedding context
    # The model is loaded and its embedding context made before the count starts.
    small = MANY[path]([[42] * 4])
    assert httpx.post(f"{server.url}{path}", json=small, timeout=120).status_code == 200
    before = _counts(server.url)
    log_start = server.log_path.stat().st_size
    data = orjson.dumps(MANY[path]([[42] * WINDOW] * n))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        deadline = time.monotonic() + 120
        while _counts(server.url)["decoded"] == before["decoded"]:  # not a guessed time: it has begun
            assert time.monotonic() < deadline, "no input was decoded"
            time.sleep(0.05)
    # Hung up. Embedding jobs run one after another: this one is answered once the abandoned
    # one has ended (its inputs dropped; before the fix, all 16 decoded for nobody).
    assert httpx.post(f"{server.url}{path}", json=small, timeout=600).status_code == 200
    after = _counts(server.url)
    windows = (after["decoded"] - before["decoded"] - 4) / WINDOW
    assert windows <= n // 2, f"{windows:.0f} of {n} inputs were decoded after their client left"
    embedded, cancelled = (after[k] - before[k] for k in ("embedded", "cancelled"))
    assert (embedded, embedded + cancelled) == (windows + 1, n + 1)  # the engine's own count agrees
    print(f"{path}: {windows:.0f} embedded, {cancelled:.0f} cancelled")
    with server.log_path.open("rb") as log:
        log.seek(log_start)
        written = log.read()
    assert b"Traceback" not in written and b" 499 " in written, written[-2000:]
