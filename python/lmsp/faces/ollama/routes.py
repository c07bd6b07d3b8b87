"""The `/api` endpoints Ollama's clients call. HTTP only: translate the request into a plan (or
an embedding request), run it on the same services the other faces use, answer in Ollama's
shape."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson

from ... import __version__
from ...http.face import OpenAPIPart, Route, Services
from ...http.hangup import unless_client_leaves
from ...http.intake import check_plan, read_json_body
from ...http.request import Request
from ...http.wire import LMSP_VERSION, send_json
from ...protocol.errors import ProblemError
from ...security.guard import Guard
from ...security.scopes import ADMIN, EMBEDDINGS_CREATE, MODELS_READ, RESPONSES_WRITE
from ...service.embeddings import EmbeddingRequest, EmbeddingsService, parse_inputs
from .errors import is_ollama_path, send_error
from .models import OLLAMA_VERSION, ps_entry, show_body, tags_entry
from .openapi import ollama_paths
from .reply import Kind, Reply, created_at, send_reply
from .translate import OllamaRequest, chat_request, generate_request, keep_alive_seconds

__all__ = ["OllamaFace"]

# Ollama's own store operations: lmsp serves the models it finds, and changes no store.
_STORE_OPERATIONS = (
    ("POST", "/api/pull"),
    ("POST", "/api/push"),
    ("POST", "/api/create"),
    ("DELETE", "/api/delete"),
    ("POST", "/api/copy"),
    ("POST", "/api/blobs/{digest}"),
)
_EMBED_FIELDS = frozenset({"model", "input", "truncate", "options", "keep_alive", "dimensions"})


def _json_headers() -> list[tuple[str, str]]:
    return [("content-type", "application/json; charset=utf-8"), ("lmsp-version", LMSP_VERSION)]


class OllamaFace:
    def __init__(self, services: Services) -> None:
        self.s = services
        self.models = services.models
        self.embeddings = EmbeddingsService(services.models, services.limits)

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/api/chat", self.chat, RESPONSES_WRITE, metered=True),
            Route("POST", "/api/generate", self.generate, RESPONSES_WRITE, metered=True),
            Route("POST", "/api/embed", self.embed, EMBEDDINGS_CREATE, metered=True),
            Route("POST", "/api/embeddings", self.embeddings_legacy, EMBEDDINGS_CREATE, metered=True),
            Route("GET", "/api/tags", self.tags, MODELS_READ),
            Route("POST", "/api/show", self.show, MODELS_READ),
            Route("GET", "/api/ps", self.ps, MODELS_READ),
            Route("GET", "/api/version", self.version, MODELS_READ),
            # Refused with a clear error, to whoever may read the models.
            *(Route(method, path, self.read_only, MODELS_READ) for method, path in _STORE_OPERATIONS),
        ]

    def owns(self, path: str) -> bool:
        return is_ollama_path(path)

    def send_error(self, proto: Any, error: ProblemError) -> tuple[int, list[tuple[str, str]], bytes]:
        return send_error(proto, error)

    def openapi(self) -> OpenAPIPart:
        return OpenAPIPart(ollama_paths(_STORE_OPERATIONS))

    async def _body(self, req: Request) -> Any:
        # Ollama reads a body as JSON whatever its type: its documented `curl -d` examples send
        # a form's type. So does this face, for a request no foreign page sent (Request.body);
        # the other faces keep requiring application/json, which every one of their clients sends.
        return await read_json_body(req, self.s.max_body, self.s.limits, any_type=True)

    # --- generation ----------------------------------------------------------------------------

    async def chat(self, req: Request) -> None:
        await self._generate(req, "chat")

    async def generate(self, req: Request) -> None:
        await self._generate(req, "generate")

    async def _generate(self, req: Request, kind: Kind) -> None:
        started = time.perf_counter()
        body = await self._body(req)
        request = chat_request(body, req.owner) if kind == "chat" else generate_request(body, req.owner)
        if request.keep_alive == 0:
            # Unloading takes the model from every client, as an operator's unload does: 403
            # (naming keep_alive) before anything runs, as a continuation without its scope is.
            Guard.require(req.principal, ADMIN, param="keep_alive")
        plan = request.plan
        if plan is None:
            await self._load_or_unload(req, request, kind, started)
            return
        check_plan(req, plan, self.s.limits, stop_param="options.stop")
        reply = Reply(kind, request.model, started, 0.0)
        if plan.stream:
            with self.s.streams.hold(req.principal):  # before the run: a refused stream costs nothing
                run = await self.s.responses.create(plan)
                await send_reply(req.proto, run, reply, stream=True)
        else:
            loading = self.models.needs_load(plan.model)
            run = await self.s.responses.create(plan)
            if loading:
                reply = Reply(kind, request.model, started, time.perf_counter() - started)
            await send_reply(req.proto, run, reply, stream=False)
        if request.keep_alive == 0:
            await asyncio.sleep(0)  # the generation's end lets the model go on the next turn of the loop
            self.models.unload(request.model)

    async def _load_or_unload(self, req: Request, request: OllamaRequest, kind: Kind, started: float) -> None:
        """No prompt, no messages: Ollama loads the model (or, with keep_alive 0, unloads it)."""
        if request.keep_alive == 0:
            self.models.needs_load(request.model)  # 404 for a model it does not serve
            self.models.unload(request.model)
            reason = "unload"
        else:
            await self.models.get(request.model)
            reason = "load"
        empty: dict[str, Any] = (
            {"response": ""} if kind == "generate" else {"message": {"role": "assistant", "content": ""}}
        )
        answer = {
            "model": request.model,
            "created_at": created_at(),
            **empty,
            "done": True,
            "done_reason": reason,
            "total_duration": int((time.perf_counter() - started) * 1e9),
        }
        req.proto.response_bytes(200, _json_headers(), orjson.dumps(answer))

    # --- embeddings ----------------------------------------------------------------------------

    async def embed(self, req: Request) -> None:
        started = time.perf_counter()
        body = await self._body(req)
        if not isinstance(body, dict):
            raise ProblemError("invalid_request", "the body must be a JSON object")
        unknown = sorted(set(body) - _EMBED_FIELDS)
        if unknown:
            raise ProblemError("invalid_request", f"unknown field {unknown[0]!r}", param=unknown[0])
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ProblemError("invalid_request", "model is required", param="model")
        truncate = body.get("truncate", True)  # Ollama cuts an input to the window unless told not to
        if not isinstance(truncate, bool):
            raise ProblemError("invalid_request", "truncate is true or false", param="truncate")
        keep_alive_seconds(body.get("keep_alive"))
        loading = self.models.needs_load(model)
        request = EmbeddingRequest(model, parse_inputs(body.get("input")), truncate=truncate)
        embeddings = await unless_client_leaves(req.proto, self.embeddings.embed(request))
        dimensions = body.get("dimensions")
        if dimensions is not None and dimensions != embeddings.dimensions:
            raise ProblemError(
                "invalid_request",
                f"this model's embeddings have {embeddings.dimensions} dimensions, not {dimensions!r}",
                param="dimensions",
            )
        total = time.perf_counter() - started
        answer = {
            "model": model,
            "embeddings": embeddings.vectors,
            "total_duration": int(total * 1e9),
            "load_duration": int(total * 1e9) if loading else 0,
            "prompt_eval_count": embeddings.input_tokens,
        }
        req.proto.response_bytes(200, _json_headers(), orjson.dumps(answer))

    async def embeddings_legacy(self, req: Request) -> None:
        """The older `/api/embeddings`: one `prompt`, one `embedding`."""
        body = await self._body(req)
        if not isinstance(body, dict) or not isinstance(body.get("model"), str) or not body["model"]:
            raise ProblemError("invalid_request", "model is required", param="model")
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ProblemError("invalid_request", "prompt is a string", param="prompt")
        request = EmbeddingRequest(body["model"], (prompt,), truncate=True, param="prompt")
        embeddings = await unless_client_leaves(req.proto, self.embeddings.embed(request))
        req.proto.response_bytes(200, _json_headers(), orjson.dumps({"embedding": embeddings.vectors[0]}))

    # --- models --------------------------------------------------------------------------------

    async def tags(self, req: Request) -> None:
        ids = self.models.ids
        # Each file's header is read once (then cached): off the loop, as a disk read is.
        entries = await asyncio.to_thread(lambda: [tags_entry(i, self.models.entry(i)) for i in ids])
        send_json(req.proto, 200, {"models": entries})

    async def show(self, req: Request) -> None:
        body = await self._body(req)
        name = body.get("model") or body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str) or not name:
            raise ProblemError("invalid_request", "model is required", param="model")
        described = self.models.describe(name)
        if described is None:
            raise ProblemError("model_not_found", f"model '{name}' not found", param="model")
        entry = self.models.entry(name)
        send_json(req.proto, 200, await asyncio.to_thread(show_body, described, entry))

    async def ps(self, req: Request) -> None:
        loaded = [d for d in self.models.describe_all() if d["loaded"]]
        entries = await asyncio.to_thread(
            lambda: [ps_entry(d["id"], self.models.entry(d["id"]), d["context_window"]) for d in loaded]
        )
        send_json(req.proto, 200, {"models": entries})

    async def version(self, req: Request) -> None:
        send_json(req.proto, 200, {"version": OLLAMA_VERSION, "lmsp": __version__})

    async def read_only(self, req: Request) -> None:
        raise ProblemError(
            "invalid_request",
            "lmsp serves the model store read-only: pull, push, create, delete and copy are not available here "
            "(manage models with Ollama itself; lmsp finds them on its next start)",
        )
