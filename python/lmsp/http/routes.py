"""The LMSP endpoints. Routes do HTTP only: parse, call the service, write the answer."""

from __future__ import annotations

from ..protocol.errors import ProblemError
from ..protocol.requests import parse_json_body, validate_response_request
from ..service.models import ModelManager
from ..service.responses import ResponsesService
from .request import Request
from .sse import stream_run, watch_disconnect
from .wire import send_json, send_problem

__all__ = ["Routes"]


class Routes:
    def __init__(self, responses: ResponsesService, models: ModelManager, max_body: int, keepalive: float) -> None:
        self.responses = responses
        self.models = models
        self.max_body = max_body
        self.keepalive = keepalive

    def table(self) -> dict[tuple[str, str], object]:
        """(method, path pattern) → handler; `{name}` matches one path segment."""
        return {
            ("GET", "/lmsp/v1/models"): self.list_models,
            ("GET", "/lmsp/v1/models/{model_id}"): self.get_model,
            ("POST", "/lmsp/v1/responses"): self.create_response,
        }

    async def list_models(self, req: Request) -> None:
        send_json(req.proto, 200, {"object": "list", "data": self.models.describe_all()})

    async def get_model(self, req: Request) -> None:
        model_id = req.params["model_id"]
        described = self.models.describe(model_id)
        if described is None:
            raise ProblemError("model_not_found", f"no model {model_id!r}")
        send_json(req.proto, 200, described)

    async def create_response(self, req: Request) -> None:
        request = validate_response_request(parse_json_body(await req.body(self.max_body)))
        run = await self.responses.create(request)
        if request.get("stream", False):
            await stream_run(req.proto, run, self.keepalive)
            return
        watcher = watch_disconnect(req.proto, run)
        try:
            response = await self.responses.final_response(run)
        finally:
            watcher.cancel()
        if response["status"] == "failed":
            error = response["error"]
            send_problem(req.proto, ProblemError(error["code"], error["detail"]))
        else:
            send_json(req.proto, 200, response)
