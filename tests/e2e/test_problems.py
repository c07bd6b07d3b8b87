"""Bad input gets a problem document with the right code and param (§9, R6.1-8, R6.1-9)."""

from __future__ import annotations

import pytest

from helpers import MODEL, SCRIPTED, assert_problem, body, user

URL = "/lmsp/v1/responses"


def test_malformed_json(client):  # covers: R6.1-9, R9-2
    r = client.post(URL, content=b'{"model": ', headers={"content-type": "application/json"})
    assert_problem(r, 400, "invalid_json")


def test_body_not_an_object(client):  # covers: R6.1-9
    assert_problem(client.post(URL, json=[1, 2]), 400, "invalid_request", param="")


@pytest.mark.parametrize(
    ("payload", "param"),
    [
        ({"input": user("hi")}, "model"),
        ({"model": MODEL}, "input"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "input": "hello"}, "input"),
        ({**body("hi"), "temperature": 2.5}, "temperature"),
        ({**body("hi"), "temperature": -0.1}, "temperature"),
        ({**body("hi"), "temperature": "hot"}, "temperature"),
        ({**body("hi"), "max_output_tokens": 0}, "max_output_tokens"),
        ({**body("hi"), "max_output_tokens": 1.5}, "max_output_tokens"),
        ({**body("hi"), "stream": "yes"}, "stream"),
        ({**body("hi"), "temprature": 1}, "temprature"),
        (
            {
                "model": MODEL,
                "input": [{"type": "message", "role": "robot", "content": [{"type": "input_text", "text": "x"}]}],
            },
            "input[0].role",
        ),
        (
            {"model": MODEL, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text"}]}]},
            "input[0].content[0].text",
        ),
        (
            {
                "model": MODEL,
                "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]}],
            },
            "input[0].content[0].text",
        ),
        ({"model": MODEL, "input": [{"type": "telepathy"}]}, "input[0].type"),
        ({"model": MODEL, "input": [{"type": "message", "role": "user", "content": []}]}, "input[0].content"),
    ],
)
def test_invalid_request_names_the_field(client, payload, param):  # covers: R6.1-8, R6.1-9, R9-2
    assert_problem(client.post(URL, json=payload), 400, "invalid_request", param=param)


@pytest.mark.parametrize("kind", ["input_image", "input_audio", "input_file"])
def test_reserved_content_types(client, kind):  # covers: R6.1-2
    payload = {"model": MODEL, "input": [{"type": "message", "role": "user", "content": [{"type": kind, "data": "x"}]}]}
    assert_problem(client.post(URL, json=payload), 400, "unsupported_content_type", param="input[0].content[0].type")


def test_unknown_model(client):  # covers: R6.1-9
    assert_problem(client.post(URL, json=body("hi", model="nope:1b")), 404, "model_not_found", param="model")


def test_extensions_accept_anything(client):  # covers: R6.1-8
    r = client.post(URL, json=body("hi", max_output_tokens=2, extensions={"vendor.thing": {"a": [1]}}))
    assert r.status_code == 200


def test_body_too_large(client):  # covers: R6.1-9
    r = client.post(URL, json=body("x" * (5 * 1024 * 1024)))
    assert_problem(r, 413, "request_too_large")


def test_capability_the_model_lacks(client):  # covers: R6.1-3
    # The scripted backend has no vocabulary to constrain, so it lacks structured_output.
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    r = client.post(URL, json=body("hi", model=SCRIPTED, response_format=schema))
    assert_problem(r, 400, "unsupported_capability", param="response_format")


def test_context_length_exceeded(client):  # covers: R6.1-4
    # ~5,000 tokens of text, measured by the model's tokenizer after its chat template.
    assert_problem(client.post(URL, json=body("lorem ipsum " * 2500)), 400, "context_length_exceeded", param="input")


@pytest.mark.parametrize("version", ["2.0", "0.9", "2", "1.x", "one", "1.0.0"])
def test_unsupported_version(client, version):  # covers: R9-1
    r = client.post(URL, json=body("hi"), headers={"lmsp-version": version})
    assert_problem(r, 400, "unsupported_version", param="LMSP-Version")


@pytest.mark.parametrize("version", ["1.0", "1", "1.3"])
def test_any_1_x_version_is_served(client, version):  # covers: R9-1
    ok = client.get("/lmsp/v1/models", headers={"lmsp-version": version})
    assert ok.status_code == 200


def test_every_response_carries_the_version(client):  # covers: R9-1
    stored = client.post(URL, json=body("x", model=SCRIPTED, store=True))
    answers = [
        client.get("/lmsp/v1/models"),
        client.get(f"/lmsp/v1/models/{MODEL}"),
        client.get("/lmsp/v1/openapi.json"),
        stored,
        client.get(f"{URL}/{stored.json()['id']}"),
        client.post(URL, json=body("x", model=SCRIPTED, stream=True)),
        client.post(URL, json={}),
        client.delete(URL),
        client.get("/elsewhere"),
    ]
    assert [r.headers.get("lmsp-version") for r in answers] == ["1.0"] * len(answers)


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff\xfe{}",
        b"[" * 100_000 + b"]" * 100_000,
        b'{"model": "scripted:test", "input": [], "max_output_tokens": 1e400}',
        b'{"model": NaN}',
        b'{"model": "a", "model": "b", "input": 5}',
        b"",
        b"null",
        b'"string"',
        b'{"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "\\ud800"}]}]}',
    ],
)
def test_garbage_gets_a_problem_not_a_500(client, raw):  # covers: R9-2, R6.1-9
    r = client.post(URL, content=raw, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500
    assert_problem(r, r.status_code, r.json()["code"])


def test_unknown_route_and_method(client):  # covers: R9-2
    assert_problem(client.get("/lmsp/v1/nothing"), 404, "not_found")
    r = client.get(URL)
    assert_problem(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "POST"


_TOOL = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{**_TOOL, "name": "bad name!"}]}, "tools[0].name"),
        ({"tools": [{**_TOOL, "type": "retrieval"}]}, "tools[0].type"),
        ({"tools": [{**_TOOL, "parameters": "not a schema"}]}, "tools[0].parameters"),
        ({"tools": [_TOOL, _TOOL]}, "tools[1].name"),
        ({"tools": [_TOOL], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        ({"store": "yes"}, "store"),
        ({"previous_response_id": 7}, "previous_response_id"),
        ({"extensions": []}, "extensions"),
    ],
)
def test_every_field_is_validated(client, fields, param):  # covers: R6.1-1, R6.1-9
    assert_problem(client.post(URL, json=body("hi", **fields)), 400, "invalid_request", param=param)


def test_valid_tools_need_the_tools_capability(client):  # covers: R6.1-3
    r = client.post(URL, json=body("hi", model=SCRIPTED, tools=[_TOOL], tool_choice="auto"))
    assert_problem(r, 400, "unsupported_capability", param="tools")


def test_function_call_items_need_the_tools_capability(client):  # covers: R6.1-2, R6.1-3
    items = [
        *user("Weather in Hangzhou?"),
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"c": 17}'},
    ]
    r = client.post(URL, json={"model": SCRIPTED, "input": items})
    assert_problem(r, 400, "unsupported_capability", param="input[1].type")


def test_optional_fields_accepted(client):  # covers: R6.1-1
    r = client.post(
        URL,
        json=body(
            "hi",
            model=SCRIPTED,
            stream=False,
            max_output_tokens=3,
            temperature=1,
            response_format={"type": "text"},
            tool_choice="none",
            store=False,
            previous_response_id=None,
            extensions={},
        ),
    )
    assert r.status_code == 200, r.text
