"""The model object and the model list (§5, profile)."""

from __future__ import annotations

from pydantic_core import core_schema as cs

from .schema import field, literal, obj, text

__all__ = ["CAPABILITIES", "MODEL", "MODEL_LIST", "SOURCES"]

CAPABILITIES = ("streaming", "tools", "structured_output", "conversations", "reasoning")
# Where a model's file was found (engine.discovery).
SOURCES = ("embedded", "model-dir", "ollama", "huggingface", "lmstudio")

MODEL = obj(
    {
        "id": field(text, doc="Ollama-style `name:tag`."),
        "object": field(literal("model")),
        "capabilities": field(cs.list_schema(literal(*CAPABILITIES), strict=True)),
        "context_window": field(cs.int_schema(strict=True, ge=1), doc="Tokens per sequence."),
        "backend": field(literal("llama.cpp", "scripted")),
        "device": field(literal("cpu", "cuda", "metal")),
        "loaded": field(cs.bool_schema(strict=True)),
        # An extension of this service's (clients ignore fields they do not know).
        "source": field(
            literal(*SOURCES),
            required=False,
            doc="Where the file was found: the embedded default, a `--model-dir`, Ollama's store, "
            "the Hugging Face cache or LM Studio's folder.",
        ),
    },
    "Model",
)

MODEL_LIST = obj({"object": field(literal("list")), "data": field(cs.list_schema(MODEL, strict=True))}, "ModelList")
