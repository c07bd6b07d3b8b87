"""The LMSP endpoints. Routes do HTTP only: parse, call the service, write the answer."""

from __future__ import annotations

from ..observability.metrics import Metrics
from ..openai.routes import OpenAIRoutes
from ..protocol.errors import ProblemError
from ..security.limits import Limits, StreamSlots
from ..service.idempotency import Idempotency
from ..service.models import ModelManager
from ..service.responses import ResponsesService
from ..service.tasks import TasksService
from .idempotency import answer_once, idempotency_key, replayable, stream_sent
from .intake import read_response_request
from .metrics import MetricsRoutes
from .request import Request
from .sse import stream_run, watch_disconnect
from .tasks import TaskRoutes
from .wire import Sent, json_headers, send_json, send_problem

__all__ = ["Routes"]

_CREATE = "POST /lmsp/v1/responses"


class Routes:
    def __init__(
        self,
        responses: ResponsesService,
        models: ModelManager,
        idempotency: Idempotency | None,
        openapi: bytes,
        max_body: int,
        keepalive: float,
        tasks: TasksService | None,
        limits: Limits,
        streams: StreamSlots,
        *,
        metrics: Metrics | None = None,
    ) -> None:
        self.tasks = TaskRoutes(tasks, idempotency, max_body, keepalive, limits, streams) if tasks is not None else None
        self.responses = responses
        self.models = models
        self.idempotency = idempotency
        self.openapi = openapi
        self.max_body = max_body
        self.keepalive = keepalive
        self.limits = limits
        self.streams = streams
        # The OpenAI-compatible face: a second view of the same services (DESIGN, Faces).
        self.openai = OpenAIRoutes(responses, models, tasks, idempotency, max_body, keepalive, limits, streams)
        # Served whether or not metrics are kept (404 when they are not): one route table.
        self.metrics = MetricsRoutes(metrics)

    def table(self) -> dict[tuple[str, str], object]:
        """(method, path pattern) → handler; `{name}` matches one path segment."""
        table: dict[tuple[str, str], object] = {
            ("GET", "/lmsp/v1/models"): self.list_models,
            ("GET", "/lmsp/v1/models/{model_id}"): self.get_model,
            ("POST", "/lmsp/v1/responses"): self.create_response,
            ("GET", "/lmsp/v1/responses/{response_id}"): self.get_response,
            ("GET", "/lmsp/v1/openapi.json"): self.get_openapi,
        }
        if self.tasks is not None:
            table.update(self.tasks.table())
        table.update(self.openai.table())
        table.update(self.metrics.table())
        return table

    async def list_models(self, req: Request) -> None:
        send_json(req.proto, 200, {"object": "list", "data": self.models.describe_all()})

    async def get_model(self, req: Request) -> None:
        model_id = req.params["model_id"]
        described = self.models.describe(model_id)
        if described is None:
            raise ProblemError("model_not_found", f"no model {model_id!r}")
        send_json(req.proto, 200, described)

    async def get_openapi(self, req: Request) -> None:
        req.proto.response_bytes(200, json_headers(), self.openapi)

    async def get_response(self, req: Request) -> None:
        send_json(req.proto, 200, await self.responses.get(req.params["response_id"], req.owner))

    async def create_response(self, req: Request) -> None:
        key = idempotency_key(req) if self.idempotency is not None else None
        body, request = await read_response_request(req, self.max_body, self.limits)
        await answer_once(req, self.idempotency, key, _CREATE, body, lambda: self._respond(req, request))

    async def _respond(self, req: Request, request: dict[str, object]) -> Sent | None:
        """Runs the request and answers it; returns what was sent when it is worth replaying."""
        if request.get("stream", False):
            with self.streams.hold(req.principal):  # before the run: a refused stream costs nothing
                run = await self.responses.create(request, req.owner)
                delivered = await stream_run(req.proto, run, self.keepalive)
            return stream_sent(delivered, run, run.log)
        run = await self.responses.create(request, req.owner)
        watcher = watch_disconnect(req.proto, run)
        try:
            response = await self.responses.final_response(run)
        finally:
            watcher.cancel()
        if response["status"] == "failed":
            error = response["error"]
            sent = send_problem(req.proto, ProblemError(error["code"], error["detail"]))
        else:
            sent = send_json(req.proto, 200, response)
        return sent if replayable(run) else None
