"""What the grammar leaves to the check of the finished value (lmsp/engine/schema_check.py),
without a model: keywords the engine cannot compile are dropped for the grammar, which then
compiles, and the whole schema's check still rejects a value that breaks them. The schemas are
the shapes that refused real JSONSchemaBench schemas (bench/data/jsonschemabench)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from lmsp._core import GrammarError, Vocabulary
from lmsp.engine.grammar import GrammarCompiler
from lmsp.engine.schema_check import RECURSIVE_REF, relax
from lmsp.protocol.errors import ProblemError
from lmsp.service.responses import _schema_grammar

# One token a byte: any JSON can be spelled, so a schema compiles exactly when the engine
# supports it.
BYTES = Vocabulary([bytes([b]) for b in range(256)] + ["<eos>"], [256])

# (schema, a value the grammar may now produce that breaks it, a value that holds)
CASES: dict[str, tuple[dict[str, Any], Any, Any]] = {
    "not": ({"type": "object", "properties": {"a": {"not": {"type": "string"}}}}, {"a": "x"}, {"a": 1}),
    "if-then-else": (
        {
            "type": "object",
            "properties": {"kind": {"type": "string"}, "size": {"type": "integer"}},
            "if": {"properties": {"kind": {"const": "big"}}},
            "then": {"properties": {"size": {"minimum": 10}}},
            "else": {"properties": {"size": {"maximum": 9}}},
        },
        {"kind": "big", "size": 1},
        {"kind": "big", "size": 12},
    ),
    "contains": (
        {"type": "array", "items": {"type": "integer"}, "contains": {"const": 7}, "minContains": 1},
        [1, 2],
        [1, 7],
    ),
    "propertyNames": (
        {"type": "object", "additionalProperties": {"type": "integer"}, "propertyNames": {"pattern": "^[a-z]+$"}},
        {"A1": 1},
        {"ab": 1},
    ),
    "unevaluatedProperties": (
        {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "unevaluatedProperties": False,
        },
        {"a": 1, "b": 2},
        {"a": 1},
    ),
    # A pattern for names that looks around (JSONSchemaBench JsonSchemaStore vars: any name but
    # a Python keyword), in a closed object.
    "patternProperties-lookaround": (
        {
            "type": "object",
            "patternProperties": {"^(?!(and|or)$)[a-z]+$": {"type": "integer"}},
            "additionalProperties": False,
        },
        {"and": 1},
        {"x": 1},
    ),
    # min/maxProperties beside optional properties (JSONSchemaBench Github_hard o8460).
    "minProperties-with-optional": (
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "minProperties": 2},
        {"a": 1},
        {"a": 1, "b": 2},
    ),
    "maxProperties-with-optional": (
        {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}},
            "required": ["a"],
            "maxProperties": 2,
            # Other keys allowed: without this the grammar closes the object to its listed
            # keys (narrow.rs), and the engine counts a closed object's optional keys itself.
            "additionalProperties": {"type": "integer"},
        },
        {"a": 1, "b": 2, "c": 3},
        {"a": 1, "c": 3},
    ),
}


def _compile(schema: Any) -> None:
    BYTES.compile_json_schema(json.dumps(schema))


@pytest.mark.parametrize("name", list(CASES))
def test_a_keyword_the_engine_refuses_is_left_to_the_check(name):
    schema, broken, valid = CASES[name]
    with pytest.raises(GrammarError):  # what refused the schema before
        _compile(schema)
    relaxed = relax(schema)
    _compile(relaxed.schema)
    check = relaxed.check()
    assert relaxed.checked, "a keyword is left to the check"
    assert check.error(json.dumps(valid)) is None
    error = check.error(json.dumps(broken))
    assert error is not None and "broke the schema" in error


def test_what_is_dropped_is_named_and_gone_from_the_grammar():
    schema, _, _ = CASES["if-then-else"]
    relaxed = relax(schema)
    assert relaxed.checked == ("else", "if", "then")
    assert not {"if", "then", "else"} & set(relaxed.schema)
    assert relaxed.original is schema  # the check reads the whole schema


def test_a_property_named_like_a_keyword_is_kept():
    schema = {
        "type": "object",
        "properties": {"not": {"type": "string"}, "if": {"type": "integer"}},
        "required": ["not", "if"],
    }
    relaxed = relax(schema, narrowing=False)
    assert relaxed.schema == schema
    assert relaxed.checked == ()  # nothing left to the check but the engine's blind spots


@pytest.mark.parametrize(
    "schema",
    [
        # Every listed property required: the engine counts them itself.
        {"type": "object", "properties": {"a": {}}, "required": ["a"], "minProperties": 1},
        # "At least one" of a closed object's optional properties: the engine's special case.
        {"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1, "additionalProperties": False},
        # No listed properties at all.
        {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    ],
    ids=["all-required", "at-least-one-closed", "no-properties"],
)
def test_property_counts_the_engine_enforces_stay_in_the_grammar(schema):
    relaxed = relax(schema, narrowing=False)
    assert relaxed.schema == schema and relaxed.checked == ()
    _compile(relaxed.schema)


# A recursive `$ref` extended with an `allOf` (JSONSchemaBench JsonSchemaStore
# hayson-json-schema: gridMeta is `allOf: [dict]` plus keywords, and dict's values reach it).
RECURSIVE = {
    "$ref": "#/definitions/value",
    "definitions": {
        "value": {"anyOf": [{"type": "integer"}, {"$ref": "#/definitions/dict"}, {"$ref": "#/definitions/grid"}]},
        "dict": {
            "type": "object",
            "patternProperties": {"^[vx]": {"$ref": "#/definitions/value"}},
            "additionalProperties": False,
        },
        "grid": {
            "type": "object",
            "properties": {"meta": {"$ref": "#/definitions/meta"}},
            "required": ["meta"],
            "additionalProperties": False,
        },
        "meta": {"allOf": [{"$ref": "#/definitions/dict"}], "required": ["ver"], "properties": {"ver": {"const": 3}}},
    },
}


def test_a_recursive_ref_beside_other_keywords_compiles_detached_and_is_checked():
    relaxed = relax(RECURSIVE)
    with pytest.raises(GrammarError, match=RECURSIVE_REF):
        _compile(relaxed.schema)
    wider = relaxed.detached()
    assert wider is not None and wider.checked == ("allOf",)
    assert wider.schema["definitions"]["meta"] == {"$ref": "#/definitions/dict"}
    _compile(wider.schema)
    check = wider.check()
    assert check is not None
    assert check.error(json.dumps({"meta": {"ver": 3}})) is None
    assert check.error(json.dumps({"meta": {"x": 1}})) is not None  # "ver" was left to the check


# A listed property that a pattern also matches, both reaching a recursive `$ref`
# (JSONSchemaBench WashingtonPost wp_53: `by` and `^[a-zA-Z0-9_]*` in vanity credits).
_AUTHORS = {"type": "array", "items": {"anyOf": [{"$ref": "#/definitions/author"}]}}
SHARED_NAME = {
    "$ref": "#/definitions/credits",
    "definitions": {
        "credits": {
            "type": "object",
            "properties": {"by": _AUTHORS},
            "patternProperties": {"^[a-z]+$": {**_AUTHORS, "maxItems": 2}},
            "additionalProperties": False,
        },
        "author": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "credits": {"$ref": "#/definitions/credits"}},
            "required": ["name"],
            "additionalProperties": False,
        },
    },
}


def test_a_name_both_listed_and_matched_by_a_pattern_is_detached_and_checked():
    relaxed = relax(SHARED_NAME)
    with pytest.raises(GrammarError, match=RECURSIVE_REF):
        _compile(relaxed.schema)
    wider = relaxed.detached()
    assert wider is not None and wider.checked == ("patternProperties",)
    assert wider.schema["definitions"]["credits"]["patternProperties"] == {"^[a-z]+$": {}}
    _compile(wider.schema)
    check = wider.check()
    assert check is not None
    assert check.error(json.dumps({"by": [{"name": "a"}]})) is None
    three = {"by": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}  # the pattern's maxItems holds "by" too
    assert check.error(json.dumps(three)) is not None


def test_nothing_to_detach_is_none():
    assert relax({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}}, "$defs": {"a": {}}}).detached() is None


def test_the_service_compiles_the_detached_schema_only_when_the_engine_asks():
    compiler = GrammarCompiler(BYTES)
    try:
        relaxed = relax(RECURSIVE)
        enforced, _ = asyncio.run(_schema_grammar(compiler, relaxed))
        assert enforced.checked == ("allOf",) and enforced.schema != relaxed.schema
        plain = relax(CASES["not"][0])
        enforced, _ = asyncio.run(_schema_grammar(compiler, plain))
        assert enforced is plain
        with pytest.raises(ProblemError) as refused:  # another refusal is not widened away
            asyncio.run(_schema_grammar(compiler, relax({"type": "string", "pattern": "^(?=a)a+$"})))
        assert refused.value.code == "unsupported_schema" and "look-around" in str(refused.value.detail)
    finally:
        compiler.close()


def test_a_lookaround_name_pattern_drops_additional_properties_with_it():
    schema = CASES["patternProperties-lookaround"][0]
    relaxed = relax(schema)
    # Without the pattern, additionalProperties: false would refuse the names it allowed.
    assert relaxed.schema == {"type": "object"}
    assert relaxed.checked == ("additionalProperties", "patternProperties")
    assert relaxed.check() is not None and relaxed.check().error(json.dumps({"x": "no"})) is not None  # type: ignore[union-attr]
