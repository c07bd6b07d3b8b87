"""Bad input gets a problem document with the right code and param (§9, R6.1-8, R6.1-9)."""

from __future__ import annotations

import pytest

from helpers import MODEL, assert_problem, body, user

URL = "/lmsp/v1/responses"


def test_malformed_json(client):  # covers: R6.1-9
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
        ({"model": MODEL, "input": [{"type": "message", "role": "robot", "content": [{"type": "input_text", "text": "x"}]}]}, "input[0].role"),
        ({"model": MODEL, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"model": MODEL, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": 5}]}]}, "input[0].content[0].text"),
        ({"model": MODEL, "input": [{"type": "telepathy"}]}, "input[0].type"),
        ({"model": MODEL, "input": [{"type": "message", "role": "user", "content": []}]}, "input[0].content"),
    ],
)
def test_invalid_request_names_the_field(client, payload, param):  # covers: R6.1-8, R6.1-9
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
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    assert_problem(client.post(URL, json=body("hi", response_format=schema)), 400, "unsupported_capability", param="response_format")


def test_context_length_exceeded(client):  # covers: R6.1-4
    # ~5,000 tokens of text, measured by the model's tokenizer after its chat template.
    assert_problem(client.post(URL, json=body("lorem ipsum " * 2500)), 400, "context_length_exceeded", param="input")


def test_unsupported_version(client):
    r = client.post(URL, json=body("hi"), headers={"lmsp-version": "2.0"})
    assert_problem(r, 400, "unsupported_version")
    ok = client.get("/lmsp/v1/models", headers={"lmsp-version": "1.0"})
    assert ok.status_code == 200


def test_unknown_route_and_method(client):
    assert_problem(client.get("/lmsp/v1/nothing"), 404, "not_found")
    r = client.get(URL)
    assert_problem(r, 405, "method_not_allowed")
    assert r.headers["allow"] == "POST"
