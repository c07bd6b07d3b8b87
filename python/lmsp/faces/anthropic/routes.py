"""The Anthropic endpoints (`POST /v1/messages`, `POST /v1/messages/count_tokens`). HTTP only:
translate the request into a plan, run it on the same services every face runs, shape the
answer as Anthropic does."""

from __future__ import annotations

from typing import Any

from ...http.face import OpenAPIPart, Route, Services
from ...http.idempotency import answer_once, idempotency_key, replayable
from ...http.intake import check_plan, read_json_body
from ...http.request import Request
from ...http.sse import answer_of, relay_run
from ...http.wire import Sent, send_json, sse_headers
from ...protocol.errors import ProblemError
from ...protocol.openapi import IDEMPOTENCY_PARAM, VERSION_PARAM
from ...security.scopes import RESPONSES_WRITE
from .errors import is_anthropic_path, send_error
from .messages import PING, MessageEvents, message_object
from .openapi import SCHEMAS, anthropic_paths
from .translate import MessagesRequest, translate_count_tokens, translate_messages

__all__ = ["AnthropicFace"]

# Part of an Idempotency-Key's fingerprint: a key used on one route is not another's.
_CREATE_MESSAGE = "POST /v1/messages"


class AnthropicFace:
    def __init__(self, services: Services) -> None:
        self.s = services
        self.responses = services.responses

    def routes(self) -> list[Route]:
        return [
            Route("POST", "/v1/messages", self.create_message, RESPONSES_WRITE, metered=True),
            # Counting runs the model's template and tokenizer: as costly as starting one.
            Route("POST", "/v1/messages/count_tokens", self.count_tokens, RESPONSES_WRITE, metered=True),
        ]

    def owns(self, path: str) -> bool:
        return is_anthropic_path(path)

    def send_error(self, proto: Any, error: ProblemError) -> Sent:
        return send_error(proto, error)

    def openapi(self) -> OpenAPIPart:
        return OpenAPIPart(anthropic_paths(VERSION_PARAM, IDEMPOTENCY_PARAM), tuple(SCHEMAS))

    async def create_message(self, req: Request) -> None:
        key = idempotency_key(req) if self.s.replays is not None else None
        body = await read_json_body(req, self.s.max_body, self.s.limits)
        request = translate_messages(body, req.owner)
        check_plan(req, request.plan, self.s.limits, stop_param="stop_sequences")
        await answer_once(req, self.s.replays, key, _CREATE_MESSAGE, body, lambda: self._respond(req, request))

    async def _respond(self, req: Request, request: MessagesRequest) -> Sent | None:
        if not request.stream:
            run = await self.responses.create(request.plan)
            response = await answer_of(req.proto, run, self.responses)
            sent = send_json(req.proto, 200, message_object(response, request.thinking))
            return sent if replayable(run) else None
        with self.s.streams.hold(req.principal):  # before the run: a refused stream costs nothing
            run = await self.responses.create(request.plan)
            events = MessageEvents(run.id, run.model, request.thinking)
            keep = self.s.replays is not None and idempotency_key(req) is not None  # frames for a retry
            body = await relay_run(req.proto, run, events.frames, self.s.keepalive, PING, keep)
        return (200, sse_headers(), body) if body is not None and replayable(run) else None

    async def count_tokens(self, req: Request) -> None:
        body = await read_json_body(req, self.s.max_body, self.s.limits)
        plan = translate_count_tokens(body, req.owner)
        check_plan(req, plan, self.s.limits, stop_param="stop_sequences")
        send_json(req.proto, 200, {"input_tokens": await self.responses.count_tokens(plan)})
