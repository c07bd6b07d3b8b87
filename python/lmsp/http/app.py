"""The RSGI application granian serves: routing and the error boundary."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import orjson

from .. import __version__
from ..engine.sequence import Overloaded
from ..observability.accesslog import escape
from ..observability.exchange import Exchange
from ..observability.observer import Observer
from ..protocol.errors import ProblemError, draining
from ..protocol.openapi import LMSP_VERSION_PATTERN, openapi_document
from ..security.cors import Cors
from ..security.guard import Guard
from ..security.hosts import request_host
from ..security.quota import metering
from .extra_headers import WithHeaders
from .face import Face, Route, Services
from .forward import SERVED_BY, Forwarder
from .hangup import ClientLeft
from .metrics import MetricsRoutes
from .outflow import CURRENT, Outflow
from .playground import Playground
from .probes import Probes
from .request import Request

__all__ = ["App", "DEFAULT_MAX_BODY", "overloaded"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 4 * 1024 * 1024


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


def overloaded(exc: Overloaded) -> ProblemError:
    """The service's "full, retry later" as HTTP: 429 with how long to wait."""
    return ProblemError("overloaded", exc.detail, headers=[("retry-after", str(exc.retry_after))])


class App:
    def __init__(
        self,
        services: Services,
        faces: Sequence[Face],
        *,
        guard: Guard | None = None,
        cors: Cors | None = None,
        observer: Observer | None = None,
        forwarder: Forwarder | None = None,
    ) -> None:
        """`faces`: the last one writes the errors of paths no other face owns; `forwarder`:
        model work for a model a sibling replica holds is sent there (None: all served here)."""
        self.models = services.models
        self.responses = services.responses
        self.faces = list(faces)
        self.active = 0  # requests being answered, for a graceful stop
        self.working = 0  # of them, those asking for model work (metered routes): a drain waits for them
        self.readiness = services.readiness
        self.probes = Probes(services.readiness)
        self.guard = guard or Guard(None)
        self.cors = cors or Cors(frozenset())
        self.limits = services.limits
        self.limiter = services.limiter
        self.max_body = services.max_body
        self.forwarder = forwarder
        self.served_by = [(SERVED_BY, forwarder.replica)] if forwarder is not None else []
        self.observer = observer  # None: no access log, no metrics
        if observer is not None and observer.metrics is not None:
            observer.metrics.token_counts = self.limiter.counts
        self.playground = Playground()
        parts = [face.openapi() for face in self.faces]
        document = openapi_document(
            __version__,
            {path: ops for part in parts for path, ops in part.paths.items()},
            tuple(schema for part in parts for schema in part.schemas),
        )
        services.openapi = orjson.dumps(document)
        # Served whether or not metrics are kept (404 when they are not): one route table.
        metrics = MetricsRoutes(observer.metrics if observer is not None else None)
        self.routes = [route for face in self.faces for route in face.routes()] + metrics.routes()
        self._exact: dict[str, dict[str, Route]] = {}
        self._patterns: list[tuple[re.Pattern[str], str, Route]] = []
        for route in self.routes:
            if not route.scope:
                raise ValueError(f"{route.method} {route.path} names no scope")
            if "{" in route.path:
                self._patterns.append((_compile(route.path), route.method, route))
            else:
                self._exact.setdefault(route.path, {})[route.method] = route

    def _face(self, path: str) -> Face:
        """The face whose error shape `path` gets."""
        return next((face for face in self.faces if face.owns(path)), self.faces[-1])

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

    def drain(self) -> None:
        """SIGTERM's first step: not ready, and new model work refused (503 with Retry-After,
        which a balancer sends to another replica); what runs goes on, reads are served."""
        self.readiness.draining = True
        self.responses.stop_accepting()

    def shutdown(self) -> None:
        """Open streams end with an `error` event and new responses are refused (503)."""
        self.readiness.draining = True
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
        base_proto = proto  # before any header of this replica's is added: what a forward answers on
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
            if self.probes.serves(scope.path):
                if self.guard.local():  # a probe carries no token; the Host and client rules still hold
                    self.guard.principal(scope, host)
                self.probes.send(proto, scope.method, scope.path)
                if exchange is not None:
                    exchange.route = scope.path
                return
            principal = self.guard.principal(scope, host)
            version = scope.headers.get("lmsp-version")
            if version is None and "lmsp-version" in scope.headers:
                version = "(not ASCII)"  # granian drops a value it cannot decode
            _check_version(version)
            route, params = self._route(scope.method, scope.path)
            if exchange is not None:
                exchange.route, exchange.token_id = route.path, principal.token_id
                if "model_id" in params:  # GET /models/{model_id} names its model in the path
                    exchange.model = params["model_id"]
            self.guard.require(principal, route.scope)
            if route.metered and self.readiness.draining:
                raise draining()
            limits = self.limits
            req = Request(
                scope, proto, params, principal, limits.body_timeout, limits.body_deadline, origin_vetted=True
            )
            if self.forwarder is not None:
                # Before the quota and before any face plans it: a request sent on is charged
                # and planned by the sibling that serves it (http/forward.py).
                if route.metered and scope.method == "POST":
                    if await self.forwarder.route(req, base_proto, self.max_body):
                        return
                proto = WithHeaders(proto, self.served_by)
            # Model work is held to the token's quota (429 past it); its answer, whatever it
            # is, says how much is left (`x-ratelimit-*`, as OpenAI's do).
            admitted = self.limiter.admit(principal) if route.metered else None
            meter = None
            if admitted is not None:
                meter, ratelimit = admitted
                if ratelimit:
                    proto = WithHeaders(proto, ratelimit)
            req.proto = proto
            # A stream written for this request measures its reader's drain (http/outflow.py);
            # --max-stream-buffer 0 writes as granian takes it, unbounded (a bench's control).
            CURRENT.set(Outflow(scope, limits.stream_buffer, limits.write_timeout) if limits.stream_buffer else None)
            # Its Origin, if any, passed self.cors.check above: the service's own or a listed one.
            self.working += route.metered
            try:
                with metering(meter):
                    await route.handler(req)
            finally:
                self.working -= route.metered
        except ClientLeft:
            if exchange is not None:
                exchange.status = 499  # nobody to answer; nginx's "client closed request"
        except ProblemError as error:
            # Each face answers in its own error shape: problem documents, or OpenAI's objects.
            self._face(scope.path).send_error(proto, error)
        except Overloaded as exc:
            self._face(scope.path).send_error(proto, overloaded(exc))
        except Exception:
            # A bug, never the client's doing: log it, answer without a stack trace.
            # The path as the client sent it, escaped: CR, LF or ESC in it must not forge a line.
            log.exception("unhandled error on %s %s", escape(scope.method), escape(scope.path))
            try:
                failure = ProblemError("internal_error", "the service failed on this request")
                self._face(scope.path).send_error(proto, failure)
            except Exception:  # the response had already started
                pass
