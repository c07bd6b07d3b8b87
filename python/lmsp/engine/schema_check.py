"""Schemas the grammar enforces in part, and the check of the finished value for the rest.

The order is fixed: the schema as the client gave it is narrowed first (lmsp_constrain's
`narrow`, which sees every keyword and keeps open any object a dropped keyword could add keys
to), then relaxed for the grammar (below), and the finished value is always checked against the
schema as given. So what the check requires is never something the grammar was made to forbid,
and the grammar's outputs that the check refuses are the engine's blind spots, counted and
logged (observability/grammar.py), not a routine failure.

Real schemas use a few keywords no token grammar can express: `uniqueItems`, `dependencies`
(`dependentRequired`, `dependentSchemas`), and `oneOf` whose branches may both match. Refusing
them refused a fifth of a real-world sample; ignoring them, as llama-server does, makes the
promise of valid JSON luck. So the grammar enforces the rest of the schema (`oneOf` as `anyOf`,
which is all it can), and the finished value is checked against the whole schema: a value that
breaks one of these keywords ends the response `failed`, never as a valid-looking answer.

The grammar engine (llguidance 1.9) also leaves out `not`, `if`/`then`/`else`, `contains`
(`minContains`, `maxContains`), `propertyNames` and `unevaluated*`, and `minProperties`/
`maxProperties` on an object with optional properties (save "at least one" or "at most one" of a
closed object): they are dropped for the grammar and left to the check alike. Dropping an
assertion keyword only widens what its schema accepts (no keyword kept below a `not` or an `if`,
which are dropped whole), so the grammar's outputs are a superset of the valid ones and the
check alone decides: sound, never a refusal for them.

The engine cannot intersect a recursive `$ref` with what stands beside it (its siblings, or the
other members of an `allOf`), which real schemas do to extend a shared definition. Only when it
says so (`RECURSIVE_REF`), the service compiles `Relaxed.detached()`: each such `$ref` alone,
the rest dropped for the grammar and left to the check, as above; and, beside listed
properties, `patternProperties` whose schemas the engine would intersect with theirs for a name
both match, as `{}`.

A `patternProperties` name that looks around (`^(?!(and|as|...)$)[a-z_]+$`: any name but a
keyword) cannot be a grammar: the object's `patternProperties` and `additionalProperties` are
both dropped for the grammar (dropping only the pattern would hand its names to
`additionalProperties`, narrower), and left to the check. A `pattern` that looks around is
still refused: the grammar would then write any string, which the check would rarely pass.

`format` is an annotation in JSON Schema: a value the grammar does not know (`int32`, `iri`)
constrains nothing, as validators ignore it, so it is dropped, not refused.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema_rs
import orjson

from lmsp._core import narrowed_json_schema

from ..observability.grammar import rejection_counter

__all__ = ["RECURSIVE_REF", "OutputCheck", "Relaxed", "relax", "schema_text"]

log = logging.getLogger("lmsp.schema")

# llguidance's refusal of a recursive `$ref` with something beside it (json/schema.rs).
RECURSIVE_REF = "circular references with sibling keys are not supported"

# The formats the grammar engine (llguidance 1.9, json/formats.rs) writes patterns for.
KNOWN_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri", "unknown"}
)
# Checked after generation; the grammar sees the schema without them.
CHECKED_AFTER = (
    "uniqueItems",
    "dependencies",
    "dependentRequired",
    "dependentSchemas",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
)
# Keywords whose value is a count, which JSON Schema may write as an integral number (`2.0`).
_COUNTS = frozenset(
    {"minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"}
)
# How a regex looks around (ECMA-262), which the grammar engine's regexes cannot.
_LOOKAROUNDS = ("(?=", "(?!", "(?<=", "(?<!")
# Where a schema keyword's value is data, not a schema: nothing in it is rewritten.
_VALUES = frozenset({"const", "enum", "default", "examples"})
# Where a keyword's value is a map of names to schemas (a property may be named "oneOf").
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def _no_retrieval(uri: str) -> Any:
    """A client's schema never makes the service read a file or a URL (`$ref` to another
    document): such a reference is refused, as the grammar engine refuses it."""
    raise ValueError(f"$ref {uri} is another document: a schema is one document here")


class OutputCheck:
    """The whole schema's validator, run once on the finished value. `keywords`: those the
    grammar left to it (empty when the grammar enforces the whole schema)."""

    def __init__(self, schema: Mapping[str, Any] | bool, keywords: tuple[str, ...]) -> None:
        try:
            # Formats were enforced by the grammar or are annotations: not asserted twice.
            self._validator = jsonschema_rs.validator_for(
                schema if isinstance(schema, bool) else dict(schema), validate_formats=False, retriever=_no_retrieval
            )
        except (jsonschema_rs.ValidationError, jsonschema_rs.ReferencingError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            what = f"its {', '.join(keywords)}" if keywords else "it"
            raise ValueError(f"{what} cannot be checked: not a valid JSON Schema ({first})") from None
        self.keywords = keywords
        self._schema = schema
        # Made in the request, called where its output ends (the scheduler's thread, maybe).
        self._count: Callable[[str], None] | None = rejection_counter()

    def error(self, text: str) -> str | None:
        """Why `text` breaks the schema, or None when it is valid (or not JSON at all: the
        grammar's own failure, reported where it happens)."""
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        for err in self._validator.iter_errors(value):
            where = "/" + "/".join(str(p) for p in err.instance_path)
            self._rejected()
            return f"the output broke the schema at {where}: {err.message}"
        return None

    def _rejected(self) -> None:
        """Counted, and logged with the schema's hash (never its text: a client's data)."""
        kind = "left_to_check" if self.keywords else "grammar"
        digest = hashlib.sha256(schema_text(self._schema).encode()).hexdigest()[:16]
        if kind == "grammar":
            log.error("the grammar let through a value its schema refuses (schema sha256 %s): a defect", digest)
        else:
            log.info(
                "a value broke what the grammar left to the check (%s; schema sha256 %s)",
                ", ".join(self.keywords),
                digest,
            )
        if self._count is not None:
            self._count(kind)


@dataclass(frozen=True)
class Relaxed:
    """`schema`: what the grammar compiles. `checked`: the keywords it leaves to the check
    of the finished value."""

    schema: Mapping[str, Any]
    original: Mapping[str, Any]
    checked: tuple[str, ...]

    def check(self) -> OutputCheck:
        """The finished value's check, against the schema as given (always: the grammar engine
        has blind spots of its own); ValueError when the schema cannot be checked (it is not
        valid JSON Schema, or refers to another document), which the service refuses."""
        return OutputCheck(self.original, self.checked)

    def detached(self) -> Relaxed | None:
        """The same with every `$ref` alone: the keywords beside it, and an `allOf`'s other
        members where one is a `$ref`, dropped for the grammar (a wider schema) and left to
        the check; None when there is none to detach."""
        found = set(self.checked)
        schema = _detach(self.schema, found)
        if schema == self.schema:
            return None
        return Relaxed(schema, self.original, tuple(sorted(found)))


def relax(schema: Mapping[str, Any], *, narrowing: bool = True) -> Relaxed:
    """What the grammar compiles for `schema`: narrowed first (unless `narrowing` is off),
    then without what only the check can hold."""
    found: set[str] = set()
    narrowed = orjson.loads(narrowed_json_schema(schema_text(schema))) if narrowing else schema
    relaxed = _relax(narrowed, found, formats=KNOWN_FORMATS if narrowing else frozenset())
    return Relaxed(relaxed, schema, tuple(sorted(found)))


def schema_text(schema: Any) -> str:
    """A schema as JSON text; an integer past 64 bits (which orjson refuses) as Python writes it."""
    try:
        return orjson.dumps(schema).decode()
    except TypeError:
        return json.dumps(schema, ensure_ascii=False)


def _relax(node: Any, found: set[str], formats: frozenset[str]) -> Any:
    """`formats`: those the grammar writes (narrowing on: a format asserted is a narrowing, as
    2020-12 makes `format` an annotation); the rest are dropped."""
    if isinstance(node, list):
        return [_relax(item, found, formats) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    one_of = None
    for key, value in node.items():
        if key in _VALUES:
            out[key] = value
        elif key in CHECKED_AFTER:
            if key != "uniqueItems" or value is True:
                found.add(key)
        elif key == "format" and isinstance(value, str) and value not in formats:
            continue
        elif key in _COUNTS and isinstance(value, float) and value.is_integer():
            out[key] = int(value)  # 2.0 is the integer 2 in JSON Schema; the engine wants 2
        elif key == "oneOf":
            found.add(key)
            one_of = _relax(value, found, formats)
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: _relax(sub, found, formats) for name, sub in value.items()}
        else:
            out[key] = _relax(value, found, formats)
    if one_of is not None:
        if "anyOf" in out:  # both at one level: each must hold
            out["allOf"] = [*out.get("allOf", []), {"anyOf": one_of}]
        else:
            out["anyOf"] = one_of
    patterns = out.get("patternProperties")
    if isinstance(patterns, dict) and any(look in name for name in patterns for look in _LOOKAROUNDS):
        # The engine has no lookaround for names; without the patterns, what they would let
        # through must not fall to additionalProperties either: both go, the check holds them.
        found.add("patternProperties")
        out.pop("patternProperties")
        if out.pop("additionalProperties", None) is not None:
            found.add("additionalProperties")
    if not _counts_enforceable(out):
        for key in ("minProperties", "maxProperties"):
            if out.pop(key, None) is not None:
                found.add(key)
    return out


def _counts_enforceable(node: dict[str, Any]) -> bool:
    """Whether the engine enforces this object's `minProperties`/`maxProperties`
    (llguidance json/compiler.rs): always when every listed property is required; otherwise
    only "at least one" or "at most one" of a closed object's optional ones."""
    lowest, highest = node.get("minProperties"), node.get("maxProperties")
    if lowest is None and highest is None:
        return True
    properties = node.get("properties")
    if not isinstance(properties, dict) or not properties:
        return True
    required = node.get("required")
    required = {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()
    needed = sum(1 for name in properties if name in required)
    if needed == len(properties):
        return True
    lowest = max(0, lowest - needed) if isinstance(lowest, int) else 0
    highest = max(0, highest - needed) if isinstance(highest, int) else None
    if lowest == 0 and highest is None:
        return True
    return (
        lowest <= 1
        and (highest if highest is not None else 1) == 1
        and not node.get("patternProperties")
        and node.get("additionalProperties") is False
    )


# Beside a `$ref`, what other references may point into, and what never asserts: kept when
# the rest is dropped.
_LOCATORS = frozenset({"$ref", "$id", "id", "$anchor", "$defs", "definitions", "$schema"})
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$comment", "readOnly", "writeOnly", "deprecated"}
)


def _detach(node: Any, found: set[str]) -> Any:
    if isinstance(node, list):
        return [_detach(item, found) for item in node]
    if not isinstance(node, dict):
        return node
    out = {
        key: value
        if key in _VALUES
        else {name: _detach(sub, found) for name, sub in value.items()}
        if key in _SCHEMA_MAPS and isinstance(value, dict)
        else _detach(value, found)
        for key, value in node.items()
    }
    _detach_shared_names(out, found)
    members = out.get("allOf")
    if "$ref" not in out and isinstance(members, list):
        ref = next((m["$ref"] for m in members if isinstance(m, dict) and "$ref" in m), None)
        if ref is not None:
            found.add("allOf")
            out = {key: value for key, value in out.items() if key in _LOCATORS | _ANNOTATIONS}
            out["$ref"] = ref
    if "$ref" in out and set(out) - _LOCATORS - _ANNOTATIONS:
        found.add("$ref")
        out = {key: value for key, value in out.items() if key in _LOCATORS | _ANNOTATIONS}
    options = out.get("anyOf")
    if isinstance(options, list) and any(isinstance(o, dict) and "$ref" in o for o in options):
        # The engine intersects each option with the keywords beside the `anyOf`.
        extra = set(out) - _LOCATORS - _ANNOTATIONS - {"anyOf"}
        if extra:
            found.add("anyOf")
            out = {key: value for key, value in out.items() if key not in extra}
    return out


def _detach_shared_names(node: dict[str, Any], found: set[str]) -> None:
    """A name in `properties` that a `patternProperties` pattern also matches must hold both
    schemas, which the engine intersects: beside listed properties, each pattern's schema
    becomes `{}` for the grammar (any value: wider), and the check holds the names to both.
    Whether a pattern matches a name is not tried here: a client's regex, run on the event loop
    in Python's backtracking engine, could take any time."""
    names, patterns = node.get("properties"), node.get("patternProperties")
    if not isinstance(names, dict) or not names or not isinstance(patterns, dict):
        return
    if any(schema != {} for schema in patterns.values()):
        found.add("patternProperties")
        node["patternProperties"] = {pattern: {} for pattern in patterns}
