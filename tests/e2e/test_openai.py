"""The OpenAI-compatible face, Responses API, through the real `openai` SDK against a real
server on the real model (the scripted one where a test needs a response slow or long on
demand): what the SDK sends, what its stream helper rebuilds, which exception it raises."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import lark
import openai
import orjson
import pytest

from helpers import MODEL, SCRIPTED, has_id
from lmsp.testing import start_server

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "strict": True,
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
FINALS = ("response.completed", "response.incomplete", "response.failed")
# A tiny command language, in the Lark both llguidance and the `lark` package read.
COMMANDS = 'start: cmd (";" cmd)*\ncmd: "ls" | "cd " DIR | "cat " DIR\nDIR: /[a-z]{1,8}/\n'
SHELL = {
    "type": "custom",
    "name": "run",
    "description": "Runs commands in a tiny shell",
    "format": {"type": "grammar", "syntax": "lark", "definition": COMMANDS},
}
DATE = r"(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])"
# Codex's apply_patch, cut down: a patch of added files, in its own Lark grammar.
PATCH = (
    'start: "*** Begin Patch\\n" hunk+ "*** End Patch"\n'
    'hunk: "*** Add File: " PATH "\\n" ("+" LINE "\\n")+\n'
    "PATH: /[a-z\\/.]{1,30}/\nLINE: /[^\\n]{1,60}/\n"
)
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edits files with a patch",
    "format": {"type": "grammar", "syntax": "lark", "definition": PATCH},
}
DATE_TOOL = {"type": "custom", "name": "date", "format": {"type": "grammar", "syntax": "regex", "definition": DATE}}


def sdk(url: str) -> openai.OpenAI:
    # A placeholder key, as people configure SDKs for local servers: ignored without tokens.
    return openai.OpenAI(base_url=f"{url}/v1", api_key="sk-placeholder", max_retries=0, timeout=120)


@pytest.fixture()
def client(server) -> Iterator[openai.OpenAI]:
    with sdk(server.url) as c:
        yield c


def _events(stream: Any) -> list[dict[str, Any]]:
    return [event.to_dict() for event in stream]


def _continue_with(
    client: openai.OpenAI, previous: str, output: dict[str, Any], tool: dict[str, Any], **fields: Any
) -> Any:
    """The stored response continued with a call's result, the tools kept but not called:
    the answer is a message."""
    answer = client.responses.create(
        model=MODEL,
        previous_response_id=previous,
        input=[output],
        tools=[tool],
        tool_choice="none",
        temperature=0,
        **fields,
    )
    assert answer.output[0].type == "message" and answer.output_text
    return answer


def _check_sequence(events: list[dict[str, Any]]) -> None:
    """Strictly increasing sequence numbers, one final event at the end, full response objects
    in the lifecycle events, every item added closed, item ids in one place each."""
    numbers = [e["sequence_number"] for e in events]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    assert [e["type"] in FINALS for e in events] == [False] * (len(events) - 1) + [True]
    added = {e["output_index"]: e["item"]["id"] for e in events if e["type"] == "response.output_item.added"}
    done = {e["output_index"]: e["item"]["id"] for e in events if e["type"] == "response.output_item.done"}
    assert added == done
    final = events[-1]["response"]
    assert [item["id"] for item in final["output"]] == [done[i] for i in sorted(done)]


def test_models_are_openai_model_objects(client):
    listed = client.models.list()
    ids = [m.id for m in listed.data]
    assert MODEL in ids and SCRIPTED in ids
    model = client.models.retrieve(MODEL)
    assert (model.id, model.object, model.owned_by) == (MODEL, "model", "lmsp")
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("no-such:model")
    assert raised.value.code == "model_not_found"


def test_sync_response_is_stored_and_read_on_both_faces(client, server):  # covers: R6.2-6
    response = client.responses.create(
        model=MODEL, input="Say hello.", max_output_tokens=8, temperature=0, metadata={"k": "v"}
    )
    assert has_id(response.id, "resp") and response.object == "response"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text and response.output[0].content[0].type == "output_text"
    assert response.usage.output_tokens == 8 and response.usage.total_tokens == response.usage.input_tokens + 8
    assert response.metadata == {"k": "v"} and response.store is True and response.temperature == 0
    again = client.responses.retrieve(response.id)
    assert [item.to_dict() for item in again.output] == [item.to_dict() for item in response.output]
    # The same stored response on the LMSP face.
    lmsp = httpx.get(f"{server.url}/lmsp/v1/responses/{response.id}").json()
    assert lmsp["output"][0]["id"] == response.output[0].id
    assert lmsp["output"][0]["content"][0]["text"] == response.output_text


def test_stream_helper_rebuilds_the_final_response(client):  # covers: R6.3-1
    with client.responses.stream(model=MODEL, input="Say hello.", max_output_tokens=200, temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(deltas) != ""
    stored = client.responses.retrieve(final.id)
    assert stored.output[0].id == final.output[0].id and stored.output_text == final.output_text


def test_raw_stream_sequence_numbers_and_event_fields(client):  # covers: R6.3-2, R6.3-3, R6.3-7
    events = _events(
        client.responses.create(model=MODEL, input="Say hello.", max_output_tokens=6, temperature=0, stream=True)
    )
    _check_sequence(events)
    assert events[0]["sequence_number"] == 1
    kinds = [e["type"] for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all((d["output_index"], d["content_index"], d["logprobs"]) == (0, 0, []) for d in deltas)
    text_done = events[-4]
    assert text_done["text"] == "".join(d["delta"] for d in deltas)
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == text_done["text"]
    assert events[-1]["response"]["usage"]["output_tokens"] == 6


def test_function_call_round_trip_with_ids_the_same_everywhere(client):  # covers: R6.5-1, R6.5-4, R6.5-5
    events = _events(
        client.responses.create(
            model=MODEL,
            input="What is the weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            stream=True,
        )
    )
    _check_sequence(events)
    assert events[-1]["type"] == "response.completed"
    [added] = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    [done] = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta")
    [arguments_done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    final = events[-1]["response"]
    [call] = final["output"]
    assert added["type"] == "function_call" and added["arguments"] == "" and added["status"] == "in_progress"
    assert added["call_id"] == done["call_id"] == call["call_id"] and added["id"] == done["id"] == call["id"]
    assert streamed == arguments_done["arguments"] == done["arguments"] == call["arguments"]
    assert "city" in orjson.loads(call["arguments"])
    stored = client.responses.retrieve(final["id"]).output[0]
    assert (stored.id, stored.call_id, stored.arguments) == (call["id"], call["call_id"], call["arguments"])
    # The client runs the tool and continues the stored response with its result.
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"temperature_c": 18}'}
    answer = _continue_with(client, final["id"], output, WEATHER, max_output_tokens=16)
    assert answer.usage.input_tokens > final["usage"]["input_tokens"]
    items = client.responses.input_items.list(answer.id, order="asc")
    assert [i.type for i in items.data] == ["message", "function_call", "function_call_output"]


def test_json_schema_output_validates(client):  # covers: R6.5-5
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "age"],
        "properties": {
            "name": {"type": "string", "maxLength": 20},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
        },
    }
    response = client.responses.create(
        model=MODEL,
        input="Describe a fictional person: name and age.",
        text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}},
        temperature=0,
        max_output_tokens=60,
    )
    assert response.status == "completed"
    jsonschema.validate(orjson.loads(response.output_text), schema)
    anything = client.responses.create(
        model=MODEL,
        input="A JSON object about a cat.",
        text={"format": {"type": "json_object"}},
        temperature=0,
        max_output_tokens=24,
    )
    if anything.status == "completed":  # an unbounded string may run to the limit; the prefix is still valid
        assert isinstance(orjson.loads(anything.output_text), dict)
    assert anything.output_text.startswith("{")


def test_previous_response_id_delete_and_input_items_across_a_restart(tmp_path):  # covers: R6.1-5, R6.1-7
    data = tmp_path / "data"
    first = start_server(tmp_path, "--scripted-model", SCRIPTED, "--data-dir", str(data))
    try:
        with sdk(first.url) as c:
            kept = c.responses.create(model=SCRIPTED, input="remember this", instructions="be brief")
    finally:
        first.stop()
    second = start_server(tmp_path, "--scripted-model", SCRIPTED, "--data-dir", str(data))
    c = sdk(second.url)
    try:
        assert c.responses.retrieve(kept.id).output_text == "remember this"
        follow = c.responses.create(model=SCRIPTED, input="and this", previous_response_id=kept.id)
        assert follow.output_text == "and this" and follow.previous_response_id == kept.id
        assert follow.usage.input_tokens > kept.usage.input_tokens
        items = c.responses.input_items.list(follow.id)  # newest first, as OpenAI lists them
        texts = [i.content[0].text for i in items.data]
        assert texts == ["and this", "remember this", "remember this"]  # instructions are not carried
        assert [i.role for i in items.data] == ["user", "assistant", "user"]
        c.responses.delete(kept.id)
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(kept.id)
        with pytest.raises(openai.NotFoundError) as raised:
            c.responses.create(model=SCRIPTED, input="x", previous_response_id=kept.id)
        assert raised.value.param == "previous_response_id"
    finally:
        c.close()
        second.stop()


def test_background_resume_and_cancel(client):  # covers: R6.4-1, R6.4-2, R7-3
    started = client.responses.create(model=SCRIPTED, input="one two three four five six", background=True)
    assert started.background is True and started.status in ("in_progress", "completed")
    whole = _events(client.responses.retrieve(started.id, stream=True, starting_after=0))
    _check_sequence(whole)
    assert whole[-1]["type"] == "response.completed"
    cut = whole[4]["sequence_number"]
    resumed = _events(client.responses.retrieve(started.id, stream=True, starting_after=cut))
    assert resumed == whole[5:]
    assert client.responses.retrieve(started.id).output_text == "one two three four five six"
    # A long one, cancelled while it runs; its stream ends, the response is `cancelled`.
    slow = client.responses.create(model=SCRIPTED, input="!slow 50 " + "word " * 400, background=True)
    with client.responses.retrieve(slow.id, stream=True) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                break
    cancelled = client.responses.cancel(slow.id)
    assert cancelled.status == "cancelled"
    tail = _events(client.responses.retrieve(slow.id, stream=True, starting_after=0))
    assert tail[-1]["type"] == "response.failed" and tail[-1]["response"]["status"] == "cancelled"
    assert client.responses.retrieve(slow.id).status == "cancelled"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.retrieve(slow.id, stream=True, starting_after=10**9)
    assert raised.value.param == "starting_after"


def test_errors_are_openai_error_objects_with_the_lmsp_codes(client, server):  # covers: R9-2
    with pytest.raises(openai.NotFoundError) as raised:
        client.responses.retrieve("resp_01J8M5T7Z2K4N6Q8S0V3X5B9DG")
    assert raised.value.code == "response_not_found" and raised.value.type == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input="x", extra_body={"frobnicate": 1})
    assert (raised.value.code, raised.value.param) == ("invalid_request", "frobnicate")
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model=MODEL, input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]
        )
    assert raised.value.code == "unsupported_content_type" and raised.value.param == "input[0].content[0].type"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input="x", tools=[{"type": "file_search", "vector_store_ids": []}])
    assert raised.value.param == "tools[0].type"
    r = httpx.post(f"{server.url}/v1/responses", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    r = httpx.get(f"{server.url}/v1/nothing-here")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_custom_lark_tool_input_parses_streams_and_round_trips(client):  # covers: R6.5-5
    parser = lark.Lark(COMMANDS)
    events = _events(
        client.responses.create(
            model=MODEL,
            input="Show the files, then go into src.",
            tools=[SHELL],
            tool_choice={"type": "custom", "name": "run"},
            temperature=0,
            max_output_tokens=40,
            stream=True,
        )
    )
    _check_sequence(events)
    assert events[-1]["type"] == "response.completed"
    [added] = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    streamed = "".join(e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta")
    [input_done] = [e for e in events if e["type"] == "response.custom_tool_call_input.done"]
    [call] = events[-1]["response"]["output"]
    assert added["type"] == call["type"] == "custom_tool_call" and added["input"] == ""
    assert (added["id"], added["call_id"]) == (call["id"], call["call_id"]) and call["name"] == "run"
    assert streamed == input_done["input"] == call["input"] != ""
    parser.parse(call["input"])  # raises unless the whole input is in the grammar
    stored = client.responses.retrieve(events[-1]["response"]["id"]).output[0]
    assert (stored.type, stored.call_id, stored.input) == ("custom_tool_call", call["call_id"], call["input"])
    # The client runs it and continues with its output; the call reads back in its own frame.
    output = {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "README.md src"}
    answer = _continue_with(client, events[-1]["response"]["id"], output, SHELL, max_output_tokens=12)
    items = client.responses.input_items.list(answer.id, order="asc")
    assert [i.type for i in items.data] == ["message", "custom_tool_call", "custom_tool_call_output"]
    # The same exchange sent whole by a client that keeps its history (store false, as Codex).
    whole = client.responses.create(
        model=MODEL,
        input=[
            {"type": "message", "role": "user", "content": "Show the files."},
            {"type": "custom_tool_call", "call_id": call["call_id"], "name": "run", "input": call["input"]},
            {"type": "custom_tool_call_output", "call_id": call["call_id"], "output": "README.md src"},
        ],
        tools=[SHELL],
        tool_choice={"type": "custom", "name": "run"},
        store=False,
        max_output_tokens=40,
        temperature=0,
    )
    parser.parse(whole.output[0].input)


def test_custom_regex_tool_input_fully_matches(client):  # covers: R6.5-5
    response = client.responses.create(
        model=MODEL,
        input="When did people first land on the moon?",
        tools=[DATE_TOOL, WEATHER],
        tool_choice={"type": "custom", "name": "date"},
        temperature=0,
        max_output_tokens=60,
    )
    assert response.status == "completed"
    [call] = response.output
    assert call.type == "custom_tool_call" and call.name == "date"
    assert re.fullmatch(DATE, call.input)


def test_custom_tool_grammars_that_cannot_be_enforced_are_refused(client):
    broken = {**SHELL, "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "a"\n}\ncall_0: "b"'}}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input="x", tools=[WEATHER, broken])
    assert (raised.value.code, raised.value.param) == ("invalid_request", "tools[1].format.definition")
    assert "'run'" in raised.value.message
    bad_regex = {**DATE_TOOL, "format": {"type": "grammar", "syntax": "regex", "definition": "(unclosed"}}
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(model=MODEL, input="x", tools=[bad_regex])
    assert raised.value.param == "tools[0].format.definition"
    with pytest.raises(openai.BadRequestError) as raised:
        client.responses.create(
            model=MODEL, input="x", tools=[DATE_TOOL], tool_choice={"type": "function", "name": "date"}
        )
    assert raised.value.param == "tool_choice.type"


FILES = {
    "type": "namespace",
    "name": "files",
    "description": "Tools on the user's files",
    "tools": [
        {
            "type": "function",
            "name": "read_file",
            "description": "Reads a file",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
                "additionalProperties": False,
            },
        }
    ],
}


def test_namespace_tools_are_called_with_their_namespace(client):
    events = _events(
        client.responses.create(
            model=MODEL,
            input="Show me README.md.",
            tools=[FILES, WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,
            temperature=0,
            max_output_tokens=60,
            stream=True,
        )
    )
    _check_sequence(events)
    calls = {e["item"]["name"]: e["item"] for e in events if e["type"] == "response.output_item.done"}
    [call] = events[-1]["response"]["output"]
    assert calls == {call["name"]: call} and call["type"] == "function_call"
    if call["name"] == "read_file":  # the model may pick either tool
        assert call["namespace"] == "files" and isinstance(orjson.loads(call["arguments"])["path"], str)
        [done] = [e for e in events if e["type"] == "response.function_call_arguments.done"]
        assert done["name"] == "read_file"
    # A client sends a namespaced call back as it got it; the model reads it in its frame.
    answer = client.responses.create(
        model=MODEL,
        input=[
            {"type": "message", "role": "user", "content": "Show me README.md."},
            {
                "type": "function_call",
                "call_id": "call_1",
                "namespace": "files",
                "name": "read_file",
                "arguments": '{"path": "README.md"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "# lmsp"},
        ],
        tools=[FILES],
        tool_choice="none",
        max_output_tokens=12,
        temperature=0,
    )
    assert answer.status in ("completed", "incomplete") and answer.output_text
    items = client.responses.input_items.list(answer.id, order="asc").data
    assert (items[1].type, items[1].namespace, items[1].name) == ("function_call", "files", "read_file")


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True])
def test_idempotency_key_replays_the_first_answer(server, path, stream):  # covers: R9-3
    if path == "/v1/responses":
        payload = {"model": SCRIPTED, "input": "one two three", "stream": stream}
    else:
        payload = {"model": SCRIPTED, "messages": [{"role": "user", "content": "one two three"}], "stream": stream}
    headers = {"Idempotency-Key": str(uuid.uuid4())}
    first = httpx.post(f"{server.url}{path}", json=payload, headers=headers, timeout=60)
    again = httpx.post(f"{server.url}{path}", json=payload, headers=headers, timeout=60)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content  # the same response id: nothing ran twice
    assert again.headers["idempotent-replayed"] == "true" and "idempotent-replayed" not in first.headers
    if not stream:
        assert again.json()["id"] == first.json()["id"]
    other = httpx.post(f"{server.url}{path}", json={**payload, "stream": not stream}, headers=headers, timeout=60)
    assert other.status_code == 422 and other.json()["error"]["param"] == "Idempotency-Key"


def test_codex_shaped_turn_ends_completed(client):
    """What Codex CLI sends: instructions, a developer message, strict function tools and a
    custom `apply_patch` grammar tool beside local_shell and web_search (accepted, left out),
    reasoning and include, store false."""
    shell = {
        "type": "function",
        "name": "shell",
        "description": "Runs a shell command",
        "strict": True,
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}},
            "required": ["command"],
            "additionalProperties": False,
        },
    }
    with client.responses.stream(
        model=MODEL,
        instructions="You are a coding agent. Use the shell tool.",
        input=[
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Work in /tmp."}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
        ],
        tools=[shell, {"type": "local_shell"}, {"type": "web_search"}, APPLY_PATCH],
        tool_choice="required",
        parallel_tool_calls=False,
        reasoning={"effort": "medium", "summary": "auto"},
        include=["reasoning.encrypted_content"],
        store=False,
        prompt_cache_key="codex-session",
        temperature=0,
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[-1] == "response.completed" and final.status == "completed"
    [call] = final.output
    if call.type == "custom_tool_call":  # the model may pick either tool; each is exact
        assert call.name == "apply_patch"
        lark.Lark(PATCH).parse(call.input)
    else:
        assert call.type == "function_call" and call.name == "shell"
        assert isinstance(orjson.loads(call.arguments)["command"], list)
    with pytest.raises(openai.NotFoundError):  # store: false
        client.responses.retrieve(final.id)
