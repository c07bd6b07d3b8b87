"""Each keyword the grammar leaves to the check of the finished value, end to end on the real
model at T=0: relax → compile → answer → check ends `completed` with a value the whole schema
accepts (profile R6.5-6). The shapes include those that failed every answer when narrowing ran
after relax (a `dependentRequired`, an `if`/`then` that asks for a key, `minProperties`)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from helpers import body

URL = "/lmsp/v1/responses"
PERSON = "Describe a fictional person as JSON."

# keyword: (prompt, schema)
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "dependentRequired": (
        'Answer with JSON: {"a": 1, "b": <a number>}.',
        {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"], "dependentRequired": {"a": ["b"]}},
    ),
    "if-then": (
        'Answer with JSON: {"kind": "x", "extra": true}.',
        {
            "type": "object",
            "properties": {"kind": {"enum": ["x", "y"]}},
            "required": ["kind"],
            "if": {"properties": {"kind": {"const": "x"}}},
            "then": {"required": ["extra"]},
        },
    ),
    "minProperties": (
        'Answer with JSON: {"name": "Ann", "age": 30}.',
        {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "minProperties": 2},
    ),
    "dependentSchemas": (
        'Answer with JSON: {"name": "Ann", "age": 30}.',
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}},
            "required": ["name"],
            "dependentSchemas": {"name": {"required": ["age"]}},
        },
    ),
    "uniqueItems": (
        "List three different colours as a JSON array of strings.",
        {
            "type": "array",
            "items": {"type": "string", "maxLength": 12},
            "minItems": 1,
            "maxItems": 3,
            "uniqueItems": True,
        },
    ),
    "not": (
        PERSON,
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20, "not": {"const": ""}}},
            "required": ["name"],
        },
    ),
    "oneOf": (
        PERSON,
        {
            "oneOf": [
                {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]},
                {"type": "array", "items": {"type": "integer"}, "maxItems": 3},
            ]
        },
    ),
    "allOf-over-recursive-ref": (
        'Answer with JSON: {"name": "root", "kids": []}.',
        {
            "$defs": {
                "node": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
                }
            },
            "allOf": [
                {"$ref": "#/$defs/node"},
                {"properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]},
            ],
        },
    ),
    "a-64-bit-id": (
        'Answer with JSON: {"id": 1234567890123456789}.',
        {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]},
    ),
}


@pytest.mark.parametrize("keyword", CASES)
def test_each_keyword_left_to_the_check_ends_completed_and_valid(client, keyword: str) -> None:  # covers: R6.5-6
    prompt, schema = CASES[keyword]
    payload = body(
        prompt,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}},
        temperature=0,
        max_output_tokens=200,
    )
    r = client.post(URL, json=payload)
    assert r.status_code == 200, r.text
    response = r.json()
    assert response["status"] == "completed", response
    [message] = response["output"]
    text = "".join(part["text"] for part in message["content"])
    jsonschema.Draft202012Validator(schema).validate(json.loads(text))
