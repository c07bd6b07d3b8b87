"""Embeddings: texts (or the model's own token ids) to one vector each, computed by the loaded
model on its scheduler's thread (engine/scheduler.py queues them with its generations).

Faces validate their own request shape and hand over an `EmbeddingRequest`; what no face
can check alone (the model, its window, its vocabulary) is checked here, each failure a
problem naming the field (`param`) the face used for it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.backends import Embedder
from ..engine.sequence import ModelUnavailable
from ..protocol.errors import ProblemError
from ..security import quota
from ..security.limits import Limits, check_embedding_inputs, check_embedding_tokens
from .models import ModelManager

__all__ = [
    "INPUT_SCHEMA",
    "MAX_INPUT_CHARS",
    "EmbeddingRequest",
    "Embeddings",
    "EmbeddingsService",
    "parse_inputs",
]

# Characters one text may have before it is tokenized (a token is at least one character, so a
# longer text could never fit the window anyway; this bounds the tokenizer's work).
MAX_INPUT_CHARS = 64 * 1024


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    # Each input is a text, or token ids of the model's own vocabulary.
    inputs: tuple[str | tuple[int, ...], ...]
    # Over the window: cut to it (Ollama's default), else a 400 naming the input.
    truncate: bool = False
    # What the face calls the field the inputs came in (`input`), for `param`.
    param: str = "input"


@dataclass(frozen=True)
class Embeddings:
    model: str
    vectors: list[list[float]]  # unit length, in input order
    input_tokens: int
    dimensions: int


class EmbeddingsService:
    def __init__(self, models: ModelManager, limits: Limits) -> None:
        self.models = models
        self.limits = limits

    async def embed(self, request: EmbeddingRequest) -> Embeddings:
        """Raises ProblemError (the model, an input, a limit) or Overloaded (the model's queue
        is full). Cancelling the awaiting task (its client left) stops the work: tokenizing
        between two inputs, the engine before its next decode."""
        _check_count(request, self.limits)
        with await self.models.lease(request.model) as lease:
            embedder = lease.backend.embedder
            if embedder is None:
                raise ProblemError(
                    "unsupported_capability", f"model {request.model!r} computes no embeddings", param="model"
                )
            # Tokenizing 256 texts of 64 KiB takes a while: never on the event loop.
            left = threading.Event()
            try:
                inputs = await asyncio.to_thread(_tokens, embedder, request, left)
            finally:
                left.set()  # once cancelled, the thread stops at its next input
            tokens = sum(len(t) for t in inputs)
            check_embedding_tokens(tokens, request.param, self.limits)
            try:
                job = embedder.embed(inputs)
            except ModelUnavailable as exc:
                raise ProblemError("model_unavailable", str(exc)) from None
            meter = quota.current()
            if meter is not None:  # a token's quota counts what it asked the model to read
                meter.charge(input_tokens=tokens)
            try:
                vectors = await asyncio.wrap_future(job.result)
            except RuntimeError as exc:  # llama.cpp refused the batch, or the model was unloaded
                raise ProblemError("generation_failed", f"the embeddings could not be computed: {exc}") from None
            finally:
                job.cancel()  # a no-op once answered; else nobody waits: the rest is not decoded
        return Embeddings(request.model, vectors, tokens, embedder.dimensions)


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


# What `parse_inputs` takes, as every face's OpenAPI document shows it.
INPUT_SCHEMA: dict[str, Any] = {
    "description": "A text, texts, or the model's token ids (a list of integers, or lists of them).",
    "oneOf": [
        {"type": "string"},
        {"type": "array", "items": {"type": "string"}},
        {"type": "array", "items": {"type": "integer"}},
        {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
    ],
}


def parse_inputs(value: Any, param: str = "input") -> tuple[str | tuple[int, ...], ...]:
    """What every face's `input` may be (OpenAI's and Ollama's shapes alike): a text, a list of
    texts, one list of token ids, or a list of them. Raises a problem naming `param`."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and _is_tokens(value):
        return (tuple(value),)
    if isinstance(value, list):
        out: list[str | tuple[int, ...]] = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                out.append(item)
            elif _is_tokens(item):
                out.append(tuple(item))
            else:
                raise ProblemError(
                    "invalid_request", "each input is a string or a list of token ids", param=f"{param}[{i}]"
                )
        return tuple(out)
    raise ProblemError(
        "invalid_request",
        "input is a string, a list of strings, or token ids (a list of integers, or lists of them)",
        param=param,
    )


def _check_count(request: EmbeddingRequest, limits: Limits) -> None:
    if not request.inputs:
        raise ProblemError("invalid_request", "give at least one input to embed", param=request.param)
    check_embedding_inputs(len(request.inputs), request.param, limits)


def _tokens(embedder: Embedder, request: EmbeddingRequest, left: threading.Event) -> list[list[int]]:
    many = len(request.inputs) > 1
    out: list[list[int]] = []
    for i, value in enumerate(request.inputs):
        if left.is_set():  # nobody waits for these tokens any more
            break
        param = f"{request.param}[{i}]" if many else request.param
        out.append(_one(embedder, value, param, request.truncate))
    return out


def _one(embedder: Embedder, value: str | Sequence[int], param: str, truncate: bool) -> list[int]:
    if isinstance(value, str):
        if len(value) > MAX_INPUT_CHARS and not truncate:
            raise ProblemError(
                "context_length_exceeded",
                f"the input is {len(value)} characters, more than the {embedder.window} tokens it may have",
                param=param,
            )
        tokens = embedder.tokenize(value[: MAX_INPUT_CHARS if truncate else None])
    else:
        tokens = list(value)
        bad = next((t for t in tokens if not 0 <= t < embedder.vocab_size), None)
        if bad is not None:
            raise ProblemError(
                "invalid_request",
                f"token {bad} is not in the model's vocabulary (0 to {embedder.vocab_size - 1})",
                param=param,
            )
    if not tokens:
        raise ProblemError("invalid_request", "the input is empty: nothing to embed", param=param)
    if len(tokens) > embedder.window:
        if not truncate:
            raise ProblemError(
                "context_length_exceeded",
                f"the input is {len(tokens)} tokens; an embedding input may have {embedder.window}",
                param=param,
            )
        tokens = tokens[: embedder.window]
    return tokens
