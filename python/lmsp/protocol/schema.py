"""Small builders for the pydantic-core schemas of the protocol types.

Every named type carries a `ref` (`lmsp.Name`): pydantic-core validates it, and the OpenAPI
generator turns the same ref into `#/components/schemas/Name`, so the document and the
validators cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import core_schema as cs

__all__ = ["ID_PATTERN", "described", "field", "literal", "obj", "text", "typed_id"]

# Profile §6.2: a type prefix and a 26-character ULID (Crockford base32).
ID_PATTERN = "[0-9A-HJKMNP-TV-Z]{26}"

text = cs.str_schema(strict=True)


def described(description: str) -> dict[str, Any]:
    """Metadata that becomes the JSON Schema `description`."""
    return {"pydantic_js_updates": {"description": description}}


def field(schema: cs.CoreSchema, required: bool = True, doc: str | None = None) -> cs.TypedDictField:
    return cs.typed_dict_field(schema, required=required, metadata=described(doc) if doc else None)


def obj(fields: dict[str, cs.TypedDictField], name: str | None = None, doc: str | None = None) -> cs.TypedDictSchema:
    """A JSON object with exactly these fields (unknown ones are refused)."""
    return cs.typed_dict_schema(
        fields,
        extra_behavior="forbid",
        ref=f"lmsp.{name}" if name else None,
        metadata=described(doc) if doc else None,
    )


def literal(*values: str) -> cs.LiteralSchema:
    return cs.literal_schema(list(values))


def typed_id(prefix: str) -> cs.CoreSchema:
    return cs.str_schema(strict=True, pattern=f"^{prefix}_{ID_PATTERN}$")
