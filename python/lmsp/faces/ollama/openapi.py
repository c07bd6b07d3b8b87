"""The `/api` operations of the OpenAPI document. Ollama publishes no schema of its own; the
bodies here are described loosely (the `ollama` library's types are the reference) and the
errors as Ollama's `{"error": …}`."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...protocol.openapi import VERSION_PARAM
from .errors import OLLAMA_ERROR

__all__ = ["ollama_paths"]


def _errors(*statuses: int) -> dict[str, Any]:
    return {
        str(status): {
            "description": "An Ollama error: `error` says what went wrong.",
            "content": {"application/json": {"schema": OLLAMA_ERROR}},
        }
        for status in sorted({*statuses, 401, 403})
    }


def _body(required: list[str], description: str) -> dict[str, Any]:
    schema = {"type": "object", "required": required, "description": description}
    return {
        "required": True,
        # As Ollama reads it: `curl -d` sends a form's type, and no 415 comes back.
        "description": "JSON, whatever the Content-Type says (or none), unless a foreign page sent it (Origin).",
        "content": {"application/json": {"schema": schema}},
    }


def _ok(description: str, *, stream: bool = False) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": {"type": "object"}}}
    if stream:
        content["application/x-ndjson"] = {"schema": {"type": "object", "description": "One JSON object a line."}}
    return {"200": {"description": description, "content": content}}


def _op(
    op_id: str, summary: str, ok: dict[str, Any], errors: dict[str, Any], body: dict[str, Any] | None = None
) -> dict[str, Any]:
    # LMSP-Version is checked on /api as on every route (a major other than 1 is a 400).
    operation: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "parameters": [VERSION_PARAM.copy()],
        "responses": {**ok, **errors},
    }
    if body is not None:
        operation["requestBody"] = body
    return operation


def ollama_paths(store_operations: Iterable[tuple[str, str]]) -> dict[str, Any]:
    # 429: a token past its quota (its full queue is Ollama's 503).
    generation_errors = _errors(400, 404, 408, 413, 429, 500, 503)
    paths: dict[str, Any] = {
        "/api/chat": {
            "post": _op(
                "ollamaChat",
                "Ollama chat: a reply to messages, streamed as NDJSON unless stream is false.",
                _ok("The reply (the last line has done: true and the counts).", stream=True),
                generation_errors,
                _body(["model"], "model, messages, tools, format, options, stream, keep_alive, think"),
            )
        },
        "/api/generate": {
            "post": _op(
                "ollamaGenerate",
                "Ollama generate: a completion of a prompt (through the model's chat template).",
                _ok("The completion (the last line has done: true and the counts).", stream=True),
                generation_errors,
                _body(["model"], "model, prompt, system, format, options, stream, keep_alive, think"),
            )
        },
        "/api/embed": {
            "post": _op(
                "ollamaEmbed",
                "Ollama embed: one vector of unit length per input.",
                _ok("model, embeddings, prompt_eval_count"),
                generation_errors,
                _body(["model", "input"], "model, input (a text or texts), truncate, dimensions"),
            )
        },
        "/api/embeddings": {
            "post": _op(
                "ollamaEmbeddings",
                "Ollama's older embeddings endpoint: one prompt, one embedding.",
                _ok("embedding"),
                generation_errors,
                _body(["model", "prompt"], "model, prompt"),
            )
        },
        "/api/tags": {"get": _op("ollamaTags", "The models lmsp serves.", _ok("models"), _errors(400))},
        "/api/show": {
            "post": _op(
                "ollamaShow",
                "A model's details, from its GGUF header.",
                _ok("details, model_info, template, capabilities"),
                _errors(400, 404),
                _body(["model"], "model"),
            )
        },
        "/api/ps": {"get": _op("ollamaPs", "The models loaded now.", _ok("models"), _errors(400))},
        "/api/version": {"get": _op("ollamaVersion", "The Ollama API version spoken.", _ok("version"), _errors(400))},
    }
    for method, path in store_operations:
        name = path.removeprefix("/api/").split("/")[0]
        operation = _op(
            f"ollama{name.title()}", f"Refused: lmsp serves the model store read-only ({name}).", {}, _errors(400)
        )
        if "{digest}" in path:
            operation["parameters"].append(
                {"name": "digest", "in": "path", "required": True, "schema": {"type": "string"}}
            )
        paths.setdefault(path, {})[method.lower()] = operation
    return paths
