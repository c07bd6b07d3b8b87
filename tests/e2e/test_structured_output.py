"""Structured output (R6.5-6): JSON that validates against the request's schema, enforced
token by token by the constraint engine, with the real model; and the schemas it refuses."""

from __future__ import annotations

import asyncio
import json
import resource
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import jsonschema
import pytest

from fixture_files import json_schema_corpus
from helpers import MODEL, assert_problem, body, stream
from lmsp.engine.grammar import GrammarCompiler, UnsupportedGrammar
from lmsp.engine.llama import LlamaModel
from lmsp.engine.registry import embedded_model_path

URL = "/lmsp/v1/responses"
CORPUS: list[dict[str, Any]] = json_schema_corpus()


def json_format(schema: dict[str, Any], name: str = "answer") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def validate(text: str, schema: dict[str, Any]) -> None:
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    validator.validate(json.loads(text))


def output_text(response: dict[str, Any]) -> str:
    [message] = response["output"]
    return "".join(part["text"] for part in message["content"])


def generate(client: httpx.Client, case: dict[str, Any], temperature: float, **fields: Any) -> dict[str, Any]:
    payload = body(
        case["prompt"],
        response_format=json_format(case["schema"], case["name"]),
        temperature=temperature,
        max_output_tokens=512,
        extensions={"seed": 7},
        **fields,
    )
    r = client.post(URL, json=payload)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_model_advertises_structured_output(client):  # covers: R6.5-6
    model = client.get(f"/lmsp/v1/models/{MODEL}").json()
    assert "structured_output" in model["capabilities"]


def test_corpus_has_at_least_30_real_world_schemas():
    assert len(CORPUS) >= 30
    assert len({case["name"] for case in CORPUS}) == len(CORPUS)
    for case in CORPUS:
        jsonschema.Draft202012Validator.check_schema(case["schema"])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_corpus_schema_gives_valid_json(client, temperature):  # covers: R6.5-6
    # Four at a time: the model's slots batch them, as a service under load would.
    with ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda case: generate(client, case, temperature), CORPUS))
    failures = []
    for case, response in zip(CORPUS, responses, strict=True):
        text = output_text(response)
        try:
            assert response["status"] == "completed", f"status {response['status']}"
            validate(text, case["schema"])
        except (AssertionError, ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{case['name']}: {str(exc).splitlines()[0]} in {text[:120]!r}")
    print(f"\nT={temperature}: {len(CORPUS) - len(failures)}/{len(CORPUS)} corpus outputs valid")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", ["person", "order", "recipe"])
def test_streamed_output_is_the_same_valid_json(client, name):  # covers: R6.5-6, R6.3-2
    case = next(c for c in CORPUS if c["name"] == name)
    sync_text = output_text(generate(client, case, 0.0))
    payload = body(
        case["prompt"],
        response_format=json_format(case["schema"]),
        temperature=0.0,
        max_output_tokens=512,
        extensions={"seed": 7},
        stream=True,
    )
    r, events = stream(client, payload)
    assert r.status_code == 200
    deltas = "".join(data["delta"] for _, name_, data in events if name_ == "response.output_text.delta")
    assert events[-1][1] == "response.completed"
    assert deltas == sync_text
    validate(deltas, case["schema"])


# --- schemas the engine cannot enforce --------------------------------------------------


def _refused(client: httpx.Client, schema: dict[str, Any], *, code: str = "unsupported_schema") -> dict[str, Any]:
    start = time.monotonic()
    r = client.post(URL, json=body("Answer in JSON.", response_format=json_format(schema)))
    elapsed = time.monotonic() - start
    problem = assert_problem(r, 400, code, param="response_format.json_schema.schema")
    assert elapsed < 5, f"refusing took {elapsed:.1f} s"
    # The service goes on serving: the next request is answered normally.
    after = client.post(URL, json=body("Say yes.", response_format=json_format({"enum": ["yes", "no"]})))
    assert after.status_code == 200 and output_text(after.json()) in ('"yes"', '"no"')
    return problem


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"$ref": "https://example.com/schemas/person.json"}, "$ref"),
        ({"type": "string", "pattern": "^(?=a)a+$"}, "regex"),
        ({"type": "string", "pattern": "^(a)\\1$"}, "regex"),
        ({"type": "banana"}, "banana"),
        # A keyword checked after generation needs a schema its validator accepts.
        ({"type": "object", "dependentRequired": {"a": "b"}}, "not a valid JSON Schema"),
        ({"type": "array", "uniqueItems": True, "minItems": -1}, "'minItems', got -1"),
        # Not ECMA-262, the dialect JSON Schema names, though the engine's own syntax reads it.
        ({"type": "string", "pattern": "foo**"}, 'pattern "foo**" at /pattern'),
        ({"type": "object", "patternProperties": {"^x**": {}}}, "/patternProperties/^x**"),
    ],
    ids=[
        "remote-ref",
        "lookahead",
        "backreference",
        "bad-type",
        "uncheckable",
        "bad-count",
        "not-ecma-262",
        "not-ecma-262-key",
    ],
)
def test_a_schema_we_cannot_enforce_is_refused_naming_why(client, schema, named):  # covers: R6.5-6
    problem = _refused(client, schema)
    assert named in problem["detail"], problem["detail"]


# --- keywords no grammar can express: enforced in part, the finished value checked -------

CHECKED_AFTER = {
    "uniqueItems": (
        {"type": "array", "items": {"type": "integer"}, "maxItems": 4, "uniqueItems": True},
        "Four numbers.",
    ),
    "dependentRequired": (
        {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 20}, "email": {"type": "string", "format": "email"}},
            "required": ["name"],
            "dependentRequired": {"name": ["email"]},
            "additionalProperties": False,
        },
        "A contact.",
    ),
    "dependencies": (
        {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "maxLength": 10}},
            "required": ["city"],
            "dependencies": {"city": ["zip"]},
            "additionalProperties": False,
        },
        "An address.",
    ),
    "oneOf": (
        {
            "oneOf": [
                {"type": "object", "properties": {"cat": {"type": "string", "maxLength": 20}}, "required": ["cat"]},
                {"type": "object", "properties": {"dog": {"type": "string", "maxLength": 20}}, "required": ["dog"]},
            ]
        },
        "Name a pet.",
    ),
    # Keywords the grammar engine does not compile (refused before: JSONSchemaBench's real
    # schemas use them), left to the check of the finished value.
    "not": (
        {
            "type": "object",
            "properties": {"n": {"type": "integer", "not": {"const": 0}}},
            "required": ["n"],
            "additionalProperties": False,
        },
        "A number.",
    ),
    "if-then": ({"type": "string", "maxLength": 8, "if": {"minLength": 1}, "then": {"maxLength": 3}}, "A word."),
    "contains": (
        {"type": "array", "items": {"type": "integer"}, "maxItems": 4, "contains": {"minimum": 0}},
        "Four numbers.",
    ),
    # A recursive `$ref` extended by an `allOf` (JSONSchemaBench's hayson schema's shape): the
    # engine cannot intersect them, so each `$ref` is compiled alone and the rest checked.
    "recursive-ref-allOf": (
        {
            "$ref": "#/definitions/value",
            "definitions": {
                "value": {
                    "anyOf": [{"type": "integer"}, {"$ref": "#/definitions/dict"}, {"$ref": "#/definitions/grid"}]
                },
                "dict": {
                    "type": "object",
                    "patternProperties": {"^[vx]": {"$ref": "#/definitions/value"}},
                    "additionalProperties": False,
                    "maxProperties": 2,
                },
                "grid": {
                    "type": "object",
                    "properties": {"meta": {"$ref": "#/definitions/meta"}},
                    "required": ["meta"],
                    "additionalProperties": False,
                },
                "meta": {
                    "allOf": [{"$ref": "#/definitions/dict"}],
                    "required": ["ver"],
                    "properties": {"ver": {"const": 3}},
                },
            },
        },
        "A grid with its meta.",
    ),
    # JSON Schema makes a format it does not define an annotation: any string is valid.
    "unknown-format": ({"type": "string", "format": "int32", "maxLength": 12}, "A number as text."),
}


@pytest.mark.parametrize("name", list(CHECKED_AFTER))
def test_keywords_a_grammar_cannot_express_are_served_and_hold(client, name):  # covers: R6.5-6
    schema, prompt = CHECKED_AFTER[name]
    r = client.post(URL, json=body(prompt, response_format=json_format(schema), temperature=0.0, max_output_tokens=128))
    assert r.status_code in (200, 500), r.text
    if r.status_code == 500:  # the model broke what the grammar could not enforce: said, never served
        problem = assert_problem(r, 500, "generation_failed")
        assert "broke the schema" in problem["detail"]
        return
    response = r.json()
    if name in MAY_RUN_LONG and response["status"] == "incomplete":  # served, cut by the budget
        assert response["incomplete_details"]["reason"] == "max_output_tokens", response
        return
    assert response["status"] == "completed", response
    validate(output_text(response), schema)


# A recursive schema the model may nest into past the budget at T=0: served, and cut.
MAY_RUN_LONG = {"recursive-ref-allOf"}


# Only [0, 0] fits the grammar's part of this schema; uniqueItems forbids it.
IMPOSSIBLE = {"type": "array", "items": {"const": 0}, "minItems": 2, "maxItems": 2, "uniqueItems": True}


def test_a_value_that_breaks_a_checked_keyword_fails_loud(client):  # covers: R6.5-6
    r = client.post(URL, json=body("Two zeros.", response_format=json_format(IMPOSSIBLE)))
    problem = assert_problem(r, 500, "generation_failed")
    assert "non-unique" in problem["detail"], problem["detail"]
    r, events = stream(client, body("Two zeros.", response_format=json_format(IMPOSSIBLE), stream=True))
    assert r.status_code == 200
    assert events[-1][1] == "response.failed", events[-1]
    assert events[-1][2]["error"]["code"] == "generation_failed"


def test_a_tool_call_that_breaks_a_checked_keyword_fails_loud(client):  # covers: R6.5-4
    tool = {
        "type": "function",
        "name": "pair",
        "description": "Two numbers.",
        "parameters": {"type": "object", "properties": {"xs": IMPOSSIBLE}, "required": ["xs"]},
    }
    payload = body("Call pair.", tools=[tool], tool_choice="required")
    r = client.post(URL, json=payload)
    problem = assert_problem(r, 500, "generation_failed")
    assert "/xs" in problem["detail"] and "non-unique" in problem["detail"], problem["detail"]


@pytest.mark.parametrize(
    ("schema", "named"),
    [
        ({"type": "array", "items": {"type": "integer"}, "minItems": 100_000}, "minItems"),
        ({"type": "string", "minLength": 1_000_000}, "minLength"),
        ({"type": "string", "pattern": "^a{100000}$"}, "pattern"),
    ],
    ids=["minItems", "minLength", "pattern-count"],
)
def test_huge_repetition_bounds_are_refused(client, schema, named):  # covers: R6.5-6
    problem = _refused(client, schema)
    assert named in problem["detail"] and "4096" in problem["detail"], problem["detail"]


def test_deep_nesting_is_refused_in_bounded_time(client):
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(200):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    r = client.post(URL, json=body("x", response_format=json_format(schema)))
    # The service's schema-depth limit answers first; the engine refuses it on its own too.
    assert r.status_code == 400 and r.json()["code"] in {"limit_exceeded", "unsupported_schema"}, r.text


def test_a_catastrophic_backtracking_pattern_is_harmless(client):
    # (a|aa)+ takes exponential time in a backtracking engine; llguidance's derivative-based
    # lexer has no backtracking, so this schema is served, quickly, and its output validates.
    schema = {"type": "string", "pattern": "^(a|aa)+(b|bb)+$", "maxLength": 24}
    start = time.monotonic()
    r = client.post(URL, json=body("Write a's then b's.", response_format=json_format(schema), temperature=0.0))
    assert r.status_code == 200 and time.monotonic() - start < 20
    validate(output_text(r.json()), schema)


def test_many_distinct_schemas_in_a_row_through_the_service(client):
    with ThreadPoolExecutor(4) as pool:
        statuses = list(
            pool.map(
                lambda i: (
                    client.post(
                        URL,
                        json=body(
                            "A number.", max_output_tokens=2, temperature=0.0, response_format=json_format({"const": i})
                        ),
                    ).status_code
                ),
                range(300),
            )
        )
    assert statuses == [200] * 300


# --- the compiler, on the real model's vocabulary ---------------------------------------


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    return GrammarCompiler.for_model(LlamaModel(embedded_model_path()))


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_ten_thousand_distinct_schemas_keep_memory_bounded(compiler):
    async def compile_all(n: int) -> None:
        for i in range(n):
            await compiler.json_schema(
                {"type": "object", "properties": {f"k{i}": {"type": "integer"}}, "required": [f"k{i}"]}
            )

    asyncio.run(compile_all(200))  # warm up: the cache fills
    before = _rss_mib()
    asyncio.run(compile_all(10_000))
    assert compiler.vocabulary.cached_grammars <= 64
    assert _rss_mib() - before < 64, f"peak RSS grew {_rss_mib() - before:.0f} MiB"


def test_a_schema_over_the_time_budget_is_refused(compiler):
    hurried = GrammarCompiler(compiler.vocabulary, budget_s=0.02)
    # Thousands of optional properties: legal, and quadratic to compile (~0.3 s here).
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(2000)}}
    with pytest.raises(UnsupportedGrammar, match="longer than"):
        asyncio.run(hurried.json_schema(schema))
