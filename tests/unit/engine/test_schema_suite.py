"""Every schema a client may send is answered with a value it accepts or refused before the first
token (profile R6.5-6), measured on the official JSON Schema Test Suite (draft 2020-12) and not
only on a corpus of our choosing: tests/support/schema_suite.py runs the service's own steps
(narrow → relax → compile → check) with no model. And the shapes that failed every answer when
narrowing ran after relax (2903cfc): each valid value is now one the grammar can write."""

from __future__ import annotations

import json
from typing import Any

import pytest

import schema_suite
from lmsp.engine.schema_check import relax
from schema_suite import service, totals


def test_the_suite_is_sound_and_complete_and_refuses_less_than_llguidance_alone() -> None:
    ours, alone = schema_suite.results()
    a, b = totals(ours), totals(alone)
    assert a.schemas == b.schemas == 383 and a.invalid + a.valid > 1000
    # Sound: no instance the suite marks invalid gets through grammar and check.
    assert a.rejected == a.invalid, [m for m in a.misses if "invalid" in m]
    # Complete: the valid ones are accepted, save the documented narrowings.
    assert a.complete >= 0.98, [m for m in a.misses if "valid instance refused" in m]
    assert a.refused < b.refused
    # The narrowings are few and each a valid instance the wide pipeline accepts.
    assert a.narrowed <= 20


# (schema, a valid value the grammar forbade at 2903cfc)
SHAPES: dict[str, tuple[Any, Any]] = {
    "dependentRequired": (
        {"type": "object", "properties": {"a": {"const": 1}}, "required": ["a"], "dependentRequired": {"a": ["b"]}},
        {"a": 1, "b": 0},
    ),
    "if-then": (
        {
            "type": "object",
            "properties": {"kind": {"type": "string"}},
            "required": ["kind"],
            "if": {"properties": {"kind": {"const": "x"}}},
            "then": {"required": ["extra"]},
        },
        {"kind": "x", "extra": True},
    ),
    "minProperties": (
        {"type": "object", "properties": {"a": {"type": "integer"}}, "minProperties": 2},
        {"a": 1, "b": 2},
    ),
    "dependentSchemas": (
        {"properties": {"a": {"type": "integer"}}, "dependentSchemas": {"a": {"required": ["c"]}}},
        {"a": 1, "c": "x"},
    ),
    # A recursive `$ref` extended by `allOf` (compiled detached: engine.schema_check).
    "allOf-over-recursive-ref": (
        {
            "$defs": {
                "node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}
            },
            "allOf": [{"$ref": "#/$defs/node"}, {"properties": {"name": {"type": "string"}}, "required": ["name"]}],
        },
        {"name": "root", "kids": [{"kids": []}]},
    ),
    "unevaluatedProperties": (
        {"properties": {"a": {}}, "patternProperties": {"^x": {}}, "unevaluatedProperties": False},
        {"a": 1, "xy": 2},
    ),
    "a-64-bit-id": ({"type": "object", "properties": {"id": {"type": "integer"}}}, {"id": 1234567890123456789}),
    "a-const-past-the-bound": ({"type": "integer", "const": 10**18 * 9}, 10**18 * 9),
}


@pytest.mark.parametrize("name", SHAPES)
def test_a_valid_value_is_one_the_grammar_can_write(name: str) -> None:
    schema, value = SHAPES[name]
    served = service(schema)
    assert served.probe is not None, served.refusal
    assert served.accepts(value), json.dumps(value)


def test_narrowing_runs_on_the_schema_as_given() -> None:
    """`narrow` behind `relax`, as the service runs them: a keyword the check holds keeps its
    object open, and the same object without it is closed."""
    schema, _ = SHAPES["dependentRequired"]
    assert "additionalProperties" not in relax(schema).schema
    bare = {key: value for key, value in schema.items() if key != "dependentRequired"}
    assert relax(bare).schema["additionalProperties"] is False


def test_integers_keep_the_64_bit_range_and_no_more() -> None:
    served = service({"type": "integer"})
    assert served.accepts(2**63 - 1) and served.accepts(-(2**63) + 1024)
    assert not served.accepts(2**63)  # past int64: the narrowing, documented
    assert service({"type": "integer"}, narrowing=False).accepts(2**64)


def test_narrowing_can_be_turned_off() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert not service(schema).accepts({"a": 1, "b": 2})
    assert service(schema, narrowing=False).accepts({"a": 1, "b": 2})
    # Off, a format is the annotation 2020-12 makes it.
    assert not service({"format": "email"}).accepts("not an address")
    assert service({"format": "email"}, narrowing=False).accepts("not an address")


def test_a_schema_that_names_another_document_is_refused_without_reading_it() -> None:
    for ref in ("http://127.0.0.1:9/schema.json", "file:///etc/passwd"):
        served = service({"$ref": ref})
        assert served.probe is None and served.refusal
