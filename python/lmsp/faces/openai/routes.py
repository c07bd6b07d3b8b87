"""The `/v1` endpoints. HTTP only: translate the request, call the same services the LMSP
routes call, shape the answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from lmsp._core import EventLog

from ...http.face import OpenAPIPart, Route, Services
from ...http.hangup import unless_client_leaves
from ...http.idempotency import answer_once, idempotency_key, replayable, stream_sent
from ...http.intake import check_plan, read_json_body
from ...http.request import Request
from ...http.sse import answer_of, relay_run, replays, stream_log
from ...http.wire import Sent, send_json, sse_headers
from ...protocol.errors import ProblemError
from ...protocol.openapi import IDEMPOTENCY_PARAM, VERSION_PARAM
from ...security.guard import Guard
from ...security.scopes import EMBEDDINGS_CREATE, MODELS_READ, RESPONSES_READ, RESPONSES_WRITE
from ...service.embeddings import EmbeddingsService
from ...service.responses import ResponseRun
from ...service.tasks import TasksService
from .chat import ChatChunks, ChatRequest, completion_object, translate_chat_request
from .embeddings import check_dimensions, embeddings_object, translate_embeddings_request
from .errors import is_openai_path, send_error
from .objects import model_object, output_item, response_object
from .openapi import SCHEMAS, openai_paths
from .projection import Projection
from .translate import Translated, translate_response_request

__all__ = ["OpenAIFace"]

# Part of an Idempotency-Key's fingerprint: a key used on one route is not another's.
_CREATE_RESPONSE = "POST /v1/responses"
_CREATE_CHAT = "POST /v1/chat/completions"
# The run's view this face keeps: the background response's own event frames.
_VIEW = "openai"
# A comment line with no blank line after it: the OpenAI SDKs' SSE decoder keeps the last
# event id and dispatches an empty event at every blank line, which their JSON parse fails on.
KEEPALIVE = b": keep-alive\n"


def _nothing() -> None:
    pass


def _flag(req: Request, name: str) -> bool:
    value = req.query_value(name)
    if value not in (None, "true", "false"):
        raise ProblemError("invalid_request", f"`{name}` is true or false, not {value!r}", param=name)
    return value == "true"


class OpenAIFace:
    def __init__(self, services: Services) -> None:
        self.s = services
        self.responses = services.responses
        self.models = services.models
        self.tasks = services.tasks
        self.embeddings = EmbeddingsService(services.models, services.limits)

    def routes(self) -> list[Route]:
        return [
            Route("GET", "/v1/models", self.list_models, MODELS_READ),
            Route("GET", "/v1/models/{model_id}", self.get_model, MODELS_READ),
            Route("POST", "/v1/responses", self.create_response, RESPONSES_WRITE, metered=True),
            Route("GET", "/v1/responses/{response_id}", self.get_response, RESPONSES_READ),
            Route("DELETE", "/v1/responses/{response_id}", self.delete_response, RESPONSES_WRITE),
            Route("POST", "/v1/responses/{response_id}/cancel", self.cancel_response, RESPONSES_WRITE),
            Route("GET", "/v1/responses/{response_id}/input_items", self.input_items, RESPONSES_READ),
            Route("POST", "/v1/chat/completions", self.create_chat_completion, RESPONSES_WRITE, metered=True),
            Route("POST", "/v1/embeddings", self.create_embeddings, EMBEDDINGS_CREATE, metered=True),
        ]

    def owns(self, path: str) -> bool:
        return is_openai_path(path)

    def send_error(self, proto: Any, error: ProblemError) -> Sent:
        return send_error(proto, error)

    def openapi(self) -> OpenAPIPart:
        return OpenAPIPart(openai_paths(VERSION_PARAM, IDEMPOTENCY_PARAM), tuple(SCHEMAS))

    # --- models ------------------------------------------------------------------------------

    async def list_models(self, req: Request) -> None:
        send_json(req.proto, 200, {"object": "list", "data": [model_object(d) for d in self.models.describe_all()]})

    async def get_model(self, req: Request) -> None:
        model_id = req.params["model_id"]
        described = self.models.describe(model_id)
        if described is None:
            raise ProblemError("model_not_found", f"no model {model_id!r}", param="model")
        send_json(req.proto, 200, model_object(described))

    # --- responses ---------------------------------------------------------------------------

    async def create_response(self, req: Request) -> None:
        await self._create(req, _CREATE_RESPONSE, translate_response_request, self._respond)

    async def _create(
        self,
        req: Request,
        route: str,
        translate: Callable[[Any, str], Any],
        respond: Callable[[Request, Any], Awaitable[Sent | None]],
    ) -> None:
        """A creating POST of either API: read, translate, check, then answer at most once
        per Idempotency-Key (`respond` returns what a retry should get again)."""
        key = idempotency_key(req) if self.s.replays is not None else None
        body = await read_json_body(req, self.s.max_body, self.s.limits)
        translated = translate(body, req.owner)
        check_plan(req, translated.plan, self.s.limits)
        await answer_once(req, self.s.replays, key, route, body, lambda: respond(req, translated))

    async def _respond(self, req: Request, translated: Translated) -> Sent | None:
        """Answers a created response; returns what was sent when a retry should get it again."""
        if translated.background:
            return await self._background(req, translated)
        if translated.stream:
            projection = Projection(EventLog(), translated.echo)
            with self.s.streams.hold(req.principal):  # before the run: a refused stream costs nothing
                run = await self.responses.create(translated.plan, tap=projection)
                # A reader that fell behind leaves nobody to read the rest; a stored one is still wanted.
                fell_behind = _nothing if run.keep else run.cancel
                delivered = await stream_log(
                    req.proto,
                    projection.log,
                    keepalive=self.s.keepalive,
                    on_lost=run.cancel,
                    on_fell_behind=fell_behind,
                    keepalive_frame=KEEPALIVE,
                )
            return stream_sent(delivered, run, projection.log)
        run = await self.responses.create(translated.plan)
        response = await answer_of(req.proto, run, self.responses)
        sent = send_json(req.proto, 200, response_object(response, translated.echo))
        return sent if replayable(run) else None

    def _tasks(self) -> TasksService:
        if self.tasks is None:
            raise ProblemError("invalid_request", "this service runs no background responses", param="background")
        return self.tasks

    async def _background(self, req: Request, translated: Translated) -> Sent | None:
        tasks = self._tasks()
        log = EventLog(max_events=tasks.max_events, max_bytes=tasks.max_bytes, expire_after=tasks.retention)
        projection = Projection(log, translated.echo)
        created = await tasks.create(translated.plan, tap=projection)
        task = tasks.by_response(created["response_id"], req.owner)
        assert task is not None
        # Kept by the run, for as long as its task keeps its events.
        task.run.views[_VIEW] = projection
        if translated.stream:
            with self.s.streams.hold(req.principal):
                # The task runs on if the reader goes.
                delivered = await stream_log(req.proto, log, keepalive=self.s.keepalive, keepalive_frame=KEEPALIVE)
            return stream_sent(delivered, task.run, log)
        # A retry gets this same first answer (the same response): GET reads what it did since.
        return send_json(req.proto, 200, response_object(task.run.snapshot(), translated.echo))

    def _live(self, req: Request, response_id: str) -> tuple[ResponseRun, Projection] | None:
        """A background response of this face whose task still keeps its events."""
        task = self.tasks.by_response(response_id, req.owner) if self.tasks is not None else None
        projection = task.run.views.get(_VIEW) if task is not None else None
        if task is None or not isinstance(projection, Projection):
            return None
        return task.run, projection

    async def get_response(self, req: Request) -> None:
        response_id = req.params["response_id"]
        stream = _flag(req, "stream")
        after = req.query_count("starting_after", 0)
        live = self._live(req, response_id)
        if stream:
            await self._resume(req, response_id, live, after)
            return
        if live is not None:
            run, projection = live
            send_json(req.proto, 200, response_object(run.snapshot(), projection.echo))
            return
        send_json(req.proto, 200, response_object(await self.responses.get(response_id, req.owner)))

    async def _resume(
        self, req: Request, response_id: str, live: tuple[ResponseRun, Projection] | None, after: int
    ) -> None:
        if live is None:
            await self.responses.get(response_id, req.owner)  # 404 when there is no such response
            raise ProblemError(
                "event_history_expired",
                "this response's events are not kept (it was not created with background: true, or they expired); "
                "GET it without stream for the result",
            )
        log = live[1].log
        if after > log.last_id:
            raise ProblemError(
                "invalid_request",
                f"event {after} has not been sent (the newest is {log.last_id})",
                param="starting_after",
            )
        if after < log.first_id - 1:
            raise ProblemError(
                "event_history_expired", f"events after {after} are no longer kept (the oldest kept is {log.first_id})"
            )
        with self.s.streams.hold(req.principal, replays(log, after)):
            await stream_log(req.proto, log, after=after, keepalive=self.s.keepalive, keepalive_frame=KEEPALIVE)

    async def delete_response(self, req: Request) -> None:
        response_id = req.params["response_id"]
        if self.tasks is not None:  # its tasks' events go too
            await self.tasks.delete_response(response_id, req.owner)
        else:
            await self.responses.delete(response_id, req.owner)
        send_json(req.proto, 200, {"id": response_id, "object": "response", "deleted": True})

    async def cancel_response(self, req: Request) -> None:
        # The answer is the response, as GET's is: its scope too, checked before the cancel,
        # so a refused one changes nothing (as the LMSP face's task cancel).
        Guard.require(req.principal, RESPONSES_READ)
        response_id = req.params["response_id"]
        live = self._live(req, response_id)
        if live is None:
            # Not running in the background: a stored response is returned as it is (as a
            # task's cancel returns a final task).
            send_json(req.proto, 200, response_object(await self.responses.get(response_id, req.owner)))
            return
        run, projection = live
        await run.cancel_and_wait()
        send_json(req.proto, 200, response_object(run.snapshot(), projection.echo))

    async def input_items(self, req: Request) -> None:
        response_id = req.params["response_id"]
        order = req.query_value("order") or "desc"
        if order not in ("asc", "desc"):
            raise ProblemError("invalid_request", f"order is asc or desc, not {order!r}", param="order")
        limit = req.query_count("limit", 20, 1, 100)
        items = [
            _input_item(response_id, i, item)
            for i, item in enumerate(await self.responses.input_items(response_id, req.owner))
        ]
        if order == "desc":
            items.reverse()
        after = req.query_value("after")
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise ProblemError("invalid_request", f"no input item {after!r} in this response", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        send_json(
            req.proto,
            200,
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": len(items) > len(page),
            },
        )

    # --- embeddings --------------------------------------------------------------------------

    async def create_embeddings(self, req: Request) -> None:
        # No Idempotency-Key: the same inputs give the same vectors, and nothing is kept.
        body = await read_json_body(req, self.s.max_body, self.s.limits)
        request, encoding, dimensions = translate_embeddings_request(body)
        embeddings = await unless_client_leaves(req.proto, self.embeddings.embed(request))
        check_dimensions(dimensions, embeddings)
        send_json(req.proto, 200, embeddings_object(embeddings, encoding))

    # --- chat completions --------------------------------------------------------------------

    async def create_chat_completion(self, req: Request) -> None:
        await self._create(req, _CREATE_CHAT, translate_chat_request, self._complete)

    async def _complete(self, req: Request, chat: ChatRequest) -> Sent | None:
        if not chat.stream:
            run = await self.responses.create(chat.plan)
            sent = send_json(req.proto, 200, completion_object(await answer_of(req.proto, run, self.responses)))
            return sent if replayable(run) else None
        with self.s.streams.hold(req.principal):
            run = await self.responses.create(chat.plan)
            chunks = ChatChunks(run.id, run.model, run.created_at, chat.include_usage)
            keep = self.s.replays is not None and idempotency_key(req) is not None  # frames for a retry
            body = await relay_run(req.proto, run, chunks.frames, self.s.keepalive, KEEPALIVE, keep)
        return (200, sse_headers(), body) if body is not None and replayable(run) else None


_KIND = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
}


def _input_item(response_id: str, index: int, item: dict[str, Any]) -> dict[str, Any]:
    """A stored input item as OpenAI lists it; the service keeps no ids of input items, so
    each gets one from its response and its place."""
    item_id = item.get("id") or f"{_KIND.get(item['type'], 'item')}_{response_id.removeprefix('resp_')}_{index}"
    if item["type"] == "message":
        return {
            "id": item_id,
            "type": "message",
            "role": item["role"],
            "status": "completed",
            "content": item["content"],
        }
    return {**output_item(item), "id": item_id, "status": item.get("status", "completed")}
