"""The LMSP endpoints (§6, §7): HTTP only — read, translate into a plan, run it, write the answer."""

from __future__ import annotations

from typing import Any

from ...http.face import OpenAPIPart, Route, Services
from ...http.hangup import unless_client_leaves
from ...http.idempotency import answer_once, idempotency_key, replayable, stream_sent
from ...http.intake import check_plan, read_json_body
from ...http.request import Request, parse_count
from ...http.sse import answer_of, replays, stream_log, stream_run
from ...http.wire import LMSP_VERSION, Sent, json_headers, send_json, send_problem
from ...protocol.errors import ProblemError
from ...protocol.openapi import VERSION_PARAM
from ...protocol.requests import validate_response_request
from ...security.guard import Guard
from ...security.scopes import EMBEDDINGS_CREATE, MODELS_READ, RESPONSES_READ, RESPONSES_WRITE
from ...service.embeddings import EmbeddingsService
from ...service.plan import GenerationPlan
from ...service.tasks import TasksService
from .embeddings import embeddings_body, embeddings_paths, translate_embeddings
from .translate import lmsp_plan

__all__ = ["LmspFace", "resume_after"]

# Part of an Idempotency-Key's fingerprint: a key used on one route is not another's.
_CREATE_RESPONSE = "POST /lmsp/v1/responses"
_CREATE_TASK = "POST /lmsp/v1/tasks"


def _event_id(value: str, param: str) -> int:
    return parse_count(value, param)


def resume_after(req: Request) -> tuple[int, str]:
    """The id to resume after and where it came from: `?after=N`, else `Last-Event-ID`,
    else 0 (R6.4-2: `after` wins). Both are checked whichever wins: a malformed one is a
    mistake to report, not something to ignore."""
    after = req.query_value("after")
    values = req.header_values("last-event-id")
    if len(values) > 1:
        raise ProblemError("invalid_request", "give Last-Event-ID once", param="Last-Event-ID")
    header = _event_id(values[0].strip(), "Last-Event-ID") if values else 0
    if after is not None:
        return _event_id(after, "after"), "after"
    return header, "Last-Event-ID"


class LmspFace:
    def __init__(self, services: Services) -> None:
        self.s = services
        self.embeddings = EmbeddingsService(services.models, services.limits)

    def routes(self) -> list[Route]:
        routes = [
            Route("GET", "/lmsp/v1/models", self.list_models, MODELS_READ),
            Route("GET", "/lmsp/v1/models/{model_id}", self.get_model, MODELS_READ),
            Route("POST", "/lmsp/v1/responses", self.create_response, RESPONSES_WRITE, metered=True),
            Route("GET", "/lmsp/v1/responses/{response_id}", self.get_response, RESPONSES_READ),
            Route("GET", "/lmsp/v1/openapi.json", self.get_openapi, MODELS_READ),
            Route("POST", "/lmsp/v1/embeddings", self.create_embeddings, EMBEDDINGS_CREATE, metered=True),
        ]
        if self.s.tasks is not None:
            routes += [
                Route("POST", "/lmsp/v1/tasks", self.create_task, RESPONSES_WRITE, metered=True),
                Route("GET", "/lmsp/v1/tasks/{task_id}", self.get_task, RESPONSES_READ),
                Route("GET", "/lmsp/v1/tasks/{task_id}/events", self.task_events, RESPONSES_READ),
                Route("POST", "/lmsp/v1/tasks/{task_id}/cancel", self.cancel_task, RESPONSES_WRITE),
            ]
        return routes

    def owns(self, path: str) -> bool:
        return True  # problem documents are the service's own shape: every path no other face claims

    def send_error(self, proto: Any, error: ProblemError) -> Sent:
        return send_problem(proto, error)

    def openapi(self) -> OpenAPIPart:
        # The protocol's own document (protocol/openapi.py) has the rest; embeddings are an extension.
        return OpenAPIPart(embeddings_paths(VERSION_PARAM))

    # --- models ------------------------------------------------------------------------------

    async def list_models(self, req: Request) -> None:
        send_json(req.proto, 200, {"object": "list", "data": self.s.models.describe_all()})

    async def get_model(self, req: Request) -> None:
        model_id = req.params["model_id"]
        described = self.s.models.describe(model_id)
        if described is None:
            raise ProblemError("model_not_found", f"no model {model_id!r}")
        send_json(req.proto, 200, described)

    async def get_openapi(self, req: Request) -> None:
        req.proto.response_bytes(200, json_headers(), self.s.openapi)

    # --- embeddings (an extension: PROFILE.md) -------------------------------------------------

    async def create_embeddings(self, req: Request) -> None:
        body = await read_json_body(req, self.s.max_body, self.s.limits)
        embeddings = await unless_client_leaves(req.proto, self.embeddings.embed(translate_embeddings(body)))
        send_json(req.proto, 200, embeddings_body(embeddings))

    # --- responses ---------------------------------------------------------------------------

    async def _read(self, req: Request) -> tuple[Any, dict[str, Any], GenerationPlan]:
        """The body as parsed JSON, as validated, and as a plan within the service's limits."""
        body = await read_json_body(req, self.s.max_body, self.s.limits)
        request = validate_response_request(body)
        plan = lmsp_plan(request, req.owner)
        check_plan(req, plan, self.s.limits)
        return body, request, plan

    async def get_response(self, req: Request) -> None:
        send_json(req.proto, 200, await self.s.responses.get(req.params["response_id"], req.owner))

    async def create_response(self, req: Request) -> None:
        key = idempotency_key(req) if self.s.replays is not None else None
        body, _, plan = await self._read(req)
        await answer_once(req, self.s.replays, key, _CREATE_RESPONSE, body, lambda: self._respond(req, plan))

    async def _respond(self, req: Request, plan: GenerationPlan) -> Sent | None:
        """Runs the plan and answers it; returns what was sent when it is worth replaying."""
        responses = self.s.responses
        if plan.stream:
            with self.s.streams.hold(req.principal):  # before the run: a refused stream costs nothing
                run = await responses.create(plan)
                delivered = await stream_run(req.proto, run, self.s.keepalive)
            return stream_sent(delivered, run, run.log)
        run = await responses.create(plan)
        try:
            response = await answer_of(req.proto, run, responses)
        except ProblemError as exc:  # the failed generation, answered as its own problem
            sent = send_problem(req.proto, exc)
        else:
            sent = send_json(req.proto, 200, response)
        return sent if replayable(run) else None

    # --- tasks (§7) --------------------------------------------------------------------------

    def _tasks(self) -> TasksService:
        assert self.s.tasks is not None  # the task routes are mounted only with tasks
        return self.s.tasks

    async def create_task(self, req: Request) -> None:
        key = idempotency_key(req) if self.s.replays is not None else None
        body, request, plan = await self._read(req)
        if "stream" in request:
            raise ProblemError(
                "invalid_request", "a task is read through its events endpoint, not streamed", param="stream"
            )
        await answer_once(req, self.s.replays, key, _CREATE_TASK, body, lambda: self._create_task(req, plan))

    async def _create_task(self, req: Request, plan: GenerationPlan) -> Sent:
        # A retry gets this same 202 (the same task), whatever the task has done since: the
        # task's own state is what GET reads.
        task = await self._tasks().create(plan)
        return send_json(req.proto, 202, task, [("location", f"/lmsp/v1/tasks/{task['id']}")])

    async def get_task(self, req: Request) -> None:
        send_json(req.proto, 200, await self._tasks().get(req.params["task_id"], req.owner))

    async def cancel_task(self, req: Request) -> None:
        # The answer is the task with its response, as GET's is: its scope too, checked before
        # the cancel, so a refused one changes nothing.
        Guard.require(req.principal, RESPONSES_READ)
        send_json(req.proto, 200, await self._tasks().cancel(req.params["task_id"], req.owner))

    async def task_events(self, req: Request) -> None:
        after, param = resume_after(req)
        source = await self._tasks().events(req.params["task_id"], after, req.owner, param)
        if source is None:
            # Nothing after the final event: 204 tells an EventSource to stop reconnecting.
            req.proto.response_empty(204, [("lmsp-version", LMSP_VERSION)])
            return
        # The task runs on whether this reader stays or goes (§7): no on_lost.
        with self.s.streams.hold(req.principal, replays(source, after)):
            await stream_log(req.proto, source, after=after, keepalive=self.s.keepalive)
