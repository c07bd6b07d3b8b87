"""The RSGI application granian serves: routing and the error boundary."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from .. import __version__
from ..observability.exchange import Exchange
from ..observability.observer import Observer
from ..openai.errors import is_openai_path, send_error
from ..protocol.errors import ProblemError
from ..protocol.openapi import LMSP_VERSION_PATTERN, openapi_document
from ..security.cors import Cors
from ..security.guard import Guard
from ..security.hosts import request_host
from ..security.limits import Limits, StreamSlots
from ..service.idempotency import Idempotency
from ..service.models import ModelManager
from ..service.responses import ResponsesService
from ..service.tasks import TasksService
from .auth import ROUTE_SCOPES, WithHeaders
from .playground import Playground
from .request import Request
from .routes import Routes
from .sse import KEEPALIVE_SECONDS
from .wire import send_problem

__all__ = ["App", "DEFAULT_MAX_BODY"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 4 * 1024 * 1024

Handler = Callable[[Request], Awaitable[None]]
Route = tuple[Handler, str, str]  # the handler, the scope it needs, its path template


_SEGMENT = r"(?!\.\.?(?:/|$))[^/]+"  # a path segment, never `.` or `..`
# A model id may hold slashes, as Ollama's do (`someone/coder:7b`, `hf.co/org/repo:Q4_K_M`).
_PARAMETER = {"model_id": f"{_SEGMENT}(?:/{_SEGMENT})*"}


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(
        "^" + re.sub(r"\{(\w+)\}", lambda m: f"(?P<{m[1]}>{_PARAMETER.get(m[1], '[^/]+')})", pattern) + "$"
    )


_VERSION = re.compile(LMSP_VERSION_PATTERN)


def _check_version(value: str | None) -> None:
    """Requests MAY carry LMSP-Version; a major other than 1 cannot be served (§9)."""
    if value is not None and not _VERSION.match(value):
        raise ProblemError(
            "unsupported_version",
            f"LMSP-Version {value!r} is not supported; this service speaks 1.0",
            param="LMSP-Version",
        )


class App:
    def __init__(
        self,
        responses: ResponsesService,
        models: ModelManager,
        *,
        idempotency: Idempotency | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        keepalive: float = KEEPALIVE_SECONDS,
        tasks: TasksService | None = None,
        guard: Guard | None = None,
        cors: Cors | None = None,
        limits: Limits | None = None,
        observer: Observer | None = None,
    ) -> None:
        self.models = models
        self.responses = responses
        self.active = 0  # requests being answered, for a graceful stop
        self.guard = guard or Guard(None)
        self.cors = cors or Cors(frozenset())
        self.limits = limits or Limits()
        self.observer = observer  # None: no access log, no metrics
        self.playground = Playground()
        openapi = orjson.dumps(openapi_document(__version__))
        routes = Routes(
            responses,
            models,
            idempotency,
            openapi,
            max_body,
            keepalive,
            tasks,
            self.limits,
            StreamSlots(self.limits),
            metrics=observer.metrics if observer is not None else None,
        )
        self._exact: dict[str, dict[str, Route]] = {}
        self._patterns: list[tuple[re.Pattern[str], str, Route]] = []
        for (method, pattern), handler in routes.table().items():
            route = (handler, ROUTE_SCOPES[(method, pattern)], pattern)  # a route without a scope fails here
            if "{" in pattern:
                self._patterns.append((_compile(pattern), method, route))  # type: ignore[arg-type]
            else:
                self._exact.setdefault(pattern, {})[method] = route  # type: ignore[assignment]

    def _allowed(self, path: str) -> tuple[dict[str, Route], dict[str, str]]:
        """The routes at `path` by method, and the path's parameters; 404 when there are none."""
        allowed = self._exact.get(path)
        params: dict[str, str] = {}
        if allowed is None:
            allowed = {}
            for regex, m, route in self._patterns:
                if match := regex.match(path):
                    allowed[m] = route
                    params = match.groupdict()
        if not allowed:
            raise ProblemError("not_found", f"no resource at {path}")
        return allowed, params

    def _route(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed, params = self._allowed(path)
        route = allowed.get(method)
        if route is None:
            raise ProblemError(
                "method_not_allowed",
                f"{method} is not allowed on {path}",
                headers=[("allow", ", ".join(sorted(allowed)))],
            )
        return route, params

    def _preflight(self, scope: Any, proto: Any, origin: str | None, host: str | None) -> None:
        """A browser asking whether `origin` may send the request it describes. Preflights
        carry no credentials (Fetch), so only the origin and, without tokens, Host decide."""
        allowed_origin = self.cors.allow(origin)
        if self.guard.local():
            self.guard.principal(scope, host)  # the Host and client checks: no token is involved
        allowed, _ = self._allowed(scope.path)
        proto.response_empty(204, [("lmsp-version", "1.0"), *self.cors.preflight(allowed_origin, sorted(allowed))])

    def shutdown(self) -> None:
        """Open streams end with an `error` event and new responses are refused (503)."""
        self.responses.shutdown()

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        self.active += 1
        observer = self.observer
        if observer is None:
            try:
                await self._answer(scope, proto)
            finally:
                self.active -= 1
            return
        watched = observer.begin(scope, proto)
        try:
            await self._answer(scope, watched, watched.exchange)
        finally:
            self.active -= 1
            observer.end(watched)

    async def _answer(self, scope: Any, proto: Any, exchange: Exchange | None = None) -> None:
        try:
            host = request_host(scope)
            origin = scope.headers.get("origin")
            if origin is None and "origin" in scope.headers:
                origin = "(not ASCII)"
            if scope.method == "OPTIONS" and "access-control-request-method" in scope.headers:
                self._preflight(scope, proto, origin, host)
                return
            extra = self.cors.check(origin, f"{scope.scheme}://{host}" if host else None)
            if extra:
                proto = WithHeaders(proto, extra)
            if self.playground.serves(scope.method, scope.path):
                if self.guard.local():  # the page needs no token; the Host and client rules still hold
                    self.guard.principal(scope, host)
                self.playground.send(proto, scope.path)
                if exchange is not None:
                    exchange.route = scope.path  # one of the page's few paths
                return
            principal = self.guard.principal(scope, host)
            version = scope.headers.get("lmsp-version")
            if version is None and "lmsp-version" in scope.headers:
                version = "(not ASCII)"  # granian drops a value it cannot decode
            _check_version(version)
            (handler, needed, template), params = self._route(scope.method, scope.path)
            if exchange is not None:
                exchange.route, exchange.token_id = template, principal.token_id
                if "model_id" in params:  # GET /models/{model_id} names its model in the path
                    exchange.model = params["model_id"]
            self.guard.require(principal, needed)
            await handler(Request(scope, proto, params, principal, self.limits.body_timeout))
        except ProblemError as error:
            # Each face answers in its own error shape: problem documents, or OpenAI's objects.
            (send_error if is_openai_path(scope.path) else send_problem)(proto, error)
        except Exception:
            # A bug, never the client's doing: log it, answer without a stack trace.
            log.exception("unhandled error on %s %s", scope.method, scope.path)
            try:
                failure = ProblemError("internal_error", "the service failed on this request")
                (send_error if is_openai_path(scope.path) else send_problem)(proto, failure)
            except Exception:  # the response had already started
                pass
