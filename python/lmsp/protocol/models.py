"""The model object and the model list (§5, profile)."""

from __future__ import annotations

from pydantic_core import core_schema as cs

from .schema import field, literal, obj, text

__all__ = ["CAPABILITIES", "MODEL", "MODEL_LIST"]

CAPABILITIES = ("streaming", "tools", "structured_output", "conversations")

MODEL = obj(
    {
        "id": field(text, doc="Ollama-style `name:tag`."),
        "object": field(literal("model")),
        "capabilities": field(cs.list_schema(literal(*CAPABILITIES), strict=True)),
        "context_window": field(cs.int_schema(strict=True, ge=1), doc="Tokens per sequence."),
        "backend": field(literal("llama.cpp", "scripted")),
        "device": field(literal("cpu", "cuda", "metal")),
        "loaded": field(cs.bool_schema(strict=True)),
    },
    "Model",
)

MODEL_LIST = obj({"object": field(literal("list")), "data": field(cs.list_schema(MODEL, strict=True))}, "ModelList")
