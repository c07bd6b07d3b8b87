"""The Ollama face (`/api`) through Ollama's own Python library against a real server on the
real model: chat (plain, streamed as NDJSON, a `format` schema the answer validates against,
tools), generate, list, show, ps, embed; errors in Ollama's shape, store operations refused."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import orjson
import pytest

from helpers import MODEL, SCRIPTED, make_token
from lmsp.engine.registry import embedded_model_path
from lmsp.testing import RunningServer, start_server

GREEDY = {"temperature": 0, "seed": 7}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "minimum": 0}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


@pytest.fixture()
def api(server: RunningServer) -> Iterator[ollama.Client]:
    with ollama.Client(host=server.url, timeout=120) as client:
        yield client


def _final_counts(part: Any) -> None:
    assert part.done is True and part.done_reason in ("stop", "length")
    assert part.prompt_eval_count > 0 and part.eval_count > 0
    assert part.total_duration >= part.eval_duration > 0


def test_chat_plain_and_streamed(api):
    reply = api.chat(
        model=MODEL, messages=[{"role": "user", "content": "Say hello."}], options={**GREEDY, "num_predict": 8}
    )
    assert reply.model == MODEL and reply.message.role == "assistant" and reply.message.content
    assert reply.eval_count <= 8
    _final_counts(reply)
    parts = list(
        api.chat(
            model=MODEL,
            messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}],
            options={**GREEDY, "num_predict": 8},
            stream=True,
        )
    )
    assert len(parts) >= 2
    assert all(p.done is False for p in parts[:-1]) and parts[-1].message.content == ""
    assert "".join(p.message.content for p in parts)
    _final_counts(parts[-1])


def test_ndjson_is_what_ollama_streams(server):
    with (
        httpx.Client(base_url=server.url, timeout=120) as c,
        c.stream(
            "POST", "/api/generate", json={"model": MODEL, "prompt": "Hi", "options": {**GREEDY, "num_predict": 3}}
        ) as r,
    ):
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
        lines = [orjson.loads(line) for line in r.iter_lines() if line]
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert all(set(line) >= {"model", "created_at", "response"} for line in lines)


def test_chat_format_schema_is_held_by_the_grammar(api):
    reply = api.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "Make up a person. Answer in JSON."}],
        format=PERSON,
        options={**GREEDY, "num_predict": 60},
    )
    jsonschema.validate(orjson.loads(reply.message.content), PERSON)
    assert reply.done_reason == "stop"
    plain = api.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "A JSON object with your name, please."}],
        format="json",
        options={**GREEDY, "num_predict": 40},
    )
    assert plain.message.content.lstrip().startswith("{")  # an object (cut short, it may not close)


def _forced_call(server: RunningServer, stream: bool) -> list[ollama.ChatResponse]:
    """Ollama has no tool_choice; lmsp takes one as an extension (a call forced by the
    grammar), which the library cannot send: posted as the library would, read with its types."""
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "What is the weather in Tokyo?"}],
        "tools": [WEATHER],
        "tool_choice": "required",
        "options": {**GREEDY, "num_predict": 40},
        "stream": stream,
    }
    with httpx.Client(timeout=120) as c:
        r = c.post(f"{server.url}/api/chat", json=payload)
    assert r.status_code == 200, r.text
    return [ollama.ChatResponse(**orjson.loads(line)) for line in r.text.splitlines() if line]


def test_tools_calls_and_their_results(api, server):
    (reply,) = _forced_call(server, stream=False)
    (call,) = reply.message.tool_calls or []
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), WEATHER["function"]["parameters"])
    streamed = _forced_call(server, stream=True)
    calls = [c for part in streamed for c in part.message.tool_calls or []]
    assert [c.function.name for c in calls] == ["get_weather"] and streamed[-1].done
    # The call's result goes back in a `tool` message, as the library sends it.
    answer = api.chat(
        model=MODEL,
        messages=[
            {"role": "user", "content": "What is the weather in Tokyo?"},
            reply.message,
            {"role": "tool", "content": '{"temperature_c": 21, "sky": "clear"}', "tool_name": "get_weather"},
        ],
        tools=[WEATHER],
        options={**GREEDY, "num_predict": 24},
    )
    assert answer.message.content or answer.message.tool_calls
    # With tools and no forcing the model chooses; whatever it chose is well formed.
    free = api.chat(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER],
        options={**GREEDY, "num_predict": 40},
    )
    for c in free.message.tool_calls or []:
        jsonschema.validate(dict(c.function.arguments), WEATHER["function"]["parameters"])


def test_generate(api):
    reply = api.generate(
        model=MODEL,
        prompt="Why is the sky blue?",
        system="Answer in one sentence.",
        options={**GREEDY, "num_predict": 8},
    )
    assert reply.response and reply.model == MODEL
    _final_counts(reply)
    parts = list(
        api.generate(model=MODEL, prompt="Count: one, two,", options={**GREEDY, "num_predict": 4}, stream=True)
    )
    assert parts[-1].done and "".join(p.response for p in parts)
    loaded = api.generate(model=MODEL, prompt="")  # Ollama's way to load a model
    assert loaded.done_reason == "load"


def test_ollamas_own_curl_example_is_answered(server):
    """Ollama's API docs post with `curl -d '{...}'`: a form's content type, which a real Ollama
    reads as JSON (issue 38: it was a 415 here). tests/e2e/test_security.py holds the other side:
    the same body from a foreign page's Origin is refused."""
    options = {**GREEDY, "num_predict": 4}
    payload = {"model": MODEL, "prompt": "Why is the sky blue?", "stream": False, "options": options}
    r = httpx.post(
        f"{server.url}/api/generate",
        content=orjson.dumps(payload),
        headers={"content-type": "application/x-www-form-urlencoded"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.json()["done"] is True and r.json()["response"] and r.json()["eval_count"] <= 4


def test_list_show_ps_version(api, server):
    listed = {m.model: m for m in api.list().models}
    assert MODEL in listed and SCRIPTED in listed
    details = listed[MODEL].details
    assert details.format == "gguf" and details.family == "llama" and details.quantization_level == "Q4_1"
    assert listed[MODEL].size > 0 and len(listed[MODEL].digest) == 64
    shown = api.show(MODEL)
    assert "completion" in shown.capabilities and "embedding" in shown.capabilities
    assert shown.modelinfo["llama.context_length"] == 8192 and shown.template
    api.generate(model=MODEL, prompt="")
    running = {m.model: m for m in api.ps().models}
    assert running[MODEL].context_length > 0
    version = httpx.get(f"{server.url}/api/version").json()
    assert version["version"].count(".") == 2


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        yield from (s for item in value for s in _strings(item))


def test_show_names_no_path(server):
    """`/api/show` tells what Ollama's does (modelfile, parameters, template, details,
    model_info, capabilities) and no filesystem path: its Modelfile builds FROM the model's
    name, where Ollama writes its blob's absolute path (issue 38)."""
    r = httpx.post(f"{server.url}/api/show", json={"model": MODEL})
    assert r.status_code == 200, r.text
    shown = r.json()
    assert {"modelfile", "parameters", "template", "details", "model_info", "capabilities"} <= set(shown)
    assert shown["modelfile"].splitlines()[-1] == f"FROM {MODEL}"
    file = embedded_model_path()
    assert file is not None
    for folder in (file, file.parent, file.parent.parent):
        assert str(folder) not in r.text
    assert not [s for s in _strings(shown) if s.startswith("/")]


def test_embed(api):
    first = api.embed(model=MODEL, input=["The cat sat on the mat.", "Stocks fell sharply."])
    assert len(first.embeddings) == 2 and first.prompt_eval_count > 0
    for vector in first.embeddings:
        assert len(vector) == 576 and math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-4)
    again = api.embed(model=MODEL, input="The cat sat on the mat.")
    assert again.embeddings[0] == pytest.approx(first.embeddings[0], abs=1e-6)
    with pytest.raises(ollama.ResponseError) as caught:
        api.embed(model=MODEL, input="word " * 2000, truncate=False)
    assert caught.value.status_code == 400
    assert len(api.embed(model=MODEL, input="word " * 2000).embeddings[0]) == 576  # truncated by default


def test_errors_are_ollamas_shape(api, server):
    for operation in (lambda: api.pull("llama3"), lambda: api.delete(MODEL), lambda: api.copy(MODEL, "x:y")):
        with pytest.raises(ollama.ResponseError) as caught:
            operation()
        assert caught.value.status_code == 400 and "read-only" in caught.value.error
    with pytest.raises(ollama.ResponseError) as caught:
        api.chat(model="no-such:model", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 404
    r = httpx.post(
        f"{server.url}/api/chat",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "options": {"top_k": -1}},
    )
    assert r.status_code == 400 and r.json() == {"error": r.json()["error"], "param": "options.top_k"}
    r = httpx.post(f"{server.url}/api/generate", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and set(r.json()) <= {"error", "param"}
    for field, value in (("raw", True), ("format", "yaml"), ("think", "extreme"), ("keep_alive", "soon")):
        r = httpx.post(f"{server.url}/api/generate", json={"model": MODEL, "prompt": "x", field: value})
        assert r.status_code == 400 and r.json()["param"] == field, r.text


@pytest.fixture(scope="module")
def own_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    """With tokens, and its model free to unload: not the session's server."""
    work = tmp_path_factory.mktemp("ollama")
    data_dir = work / "data"
    make_token(data_dir, "models:read")  # the service has tokens from the start
    srv = start_server(work, "--data-dir", str(data_dir), "--parallel", "1")
    yield srv, data_dir
    srv.stop()


def test_keep_alive_zero_unloads(own_server):
    server, data_dir = own_server
    # Unloading is an admin's act (test_security.py: without admin, keep_alive 0 is a 403).
    token = make_token(data_dir, "models:read,responses:write,admin")
    with ollama.Client(host=server.url, timeout=120, headers={"authorization": f"Bearer {token}"}) as api:
        assert api.generate(model=MODEL, prompt="").done_reason == "load"
        assert [m.model for m in api.ps().models] == [MODEL]
        assert api.generate(model=MODEL, prompt="", keep_alive=0).done_reason == "unload"
        for _ in range(100):  # the unload runs off the loop
            if not api.ps().models:
                break
            time.sleep(0.05)
        assert api.ps().models == []


def test_each_route_needs_its_scope(own_server):
    server, data_dir = own_server
    embedder = make_token(data_dir, "embeddings:create")
    writer = make_token(data_dir, "responses:write")
    with ollama.Client(host=server.url, timeout=120, headers={"authorization": f"Bearer {embedder}"}) as api:
        assert len(api.embed(model=MODEL, input="hello").embeddings[0]) == 576
        with pytest.raises(ollama.ResponseError) as caught:
            api.chat(model=MODEL, messages=[{"role": "user", "content": "hi"}])
        assert caught.value.status_code == 403 and "responses:write" in caught.value.error
    with ollama.Client(host=server.url, timeout=120, headers={"authorization": f"Bearer {writer}"}) as api:
        with pytest.raises(ollama.ResponseError) as caught:
            api.embed(model=MODEL, input="hello")
        assert caught.value.status_code == 403 and "embeddings:create" in caught.value.error
    for path in ("/v1/embeddings", "/lmsp/v1/embeddings"):
        r = httpx.post(
            f"{server.url}{path}", json={"model": MODEL, "input": "hi"}, headers={"authorization": f"Bearer {writer}"}
        )
        assert r.status_code == 403, r.text
        r = httpx.post(
            f"{server.url}{path}", json={"model": MODEL, "input": "hi"}, headers={"authorization": f"Bearer {embedder}"}
        )
        assert r.status_code == 200, r.text
