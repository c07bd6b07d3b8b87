"""The RSGI application granian serves: routing and the error boundary."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from .. import __version__
from ..protocol.errors import ProblemError
from ..protocol.openapi import LMSP_VERSION_PATTERN, openapi_document
from ..service.idempotency import Idempotency
from ..service.models import ModelManager
from ..service.responses import ResponsesService
from ..service.tasks import TasksService
from .request import Request
from .routes import Routes
from .sse import KEEPALIVE_SECONDS
from .wire import send_problem

__all__ = ["App", "DEFAULT_MAX_BODY"]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY = 4 * 1024 * 1024

Handler = Callable[[Request], Awaitable[None]]


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", pattern) + "$")


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
    ) -> None:
        self.models = models
        self.responses = responses
        self.active = 0  # requests being answered, for a graceful stop
        openapi = orjson.dumps(openapi_document(__version__))
        routes = Routes(responses, models, idempotency, openapi, max_body, keepalive, tasks)
        self._exact: dict[str, dict[str, Handler]] = {}
        self._patterns: list[tuple[re.Pattern[str], str, Handler]] = []
        for (method, pattern), handler in routes.table().items():
            if "{" in pattern:
                self._patterns.append((_compile(pattern), method, handler))  # type: ignore[arg-type]
            else:
                self._exact.setdefault(pattern, {})[method] = handler  # type: ignore[assignment]

    def _route(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        allowed = self._exact.get(path)
        params: dict[str, str] = {}
        if allowed is None:
            allowed = {}
            for regex, m, handler in self._patterns:
                if match := regex.match(path):
                    allowed[m] = handler
                    params = match.groupdict()
        if not allowed:
            raise ProblemError("not_found", f"no resource at {path}")
        handler = allowed.get(method)
        if handler is None:
            raise ProblemError(
                "method_not_allowed",
                f"{method} is not allowed on {path}",
                headers=[("allow", ", ".join(sorted(allowed)))],
            )
        return handler, params

    def shutdown(self) -> None:
        """Open streams end with an `error` event and new responses are refused (503)."""
        self.responses.shutdown()

    async def __rsgi__(self, scope: Any, proto: Any) -> None:
        if scope.proto != "http":
            return
        self.active += 1
        try:
            await self._answer(scope, proto)
        finally:
            self.active -= 1

    async def _answer(self, scope: Any, proto: Any) -> None:
        try:
            version = scope.headers.get("lmsp-version")
            if version is None and "lmsp-version" in scope.headers:
                version = "(not ASCII)"  # granian drops a value it cannot decode
            _check_version(version)
            handler, params = self._route(scope.method, scope.path)
            await handler(Request(scope, proto, params))
        except ProblemError as error:
            send_problem(proto, error)
        except Exception:
            # A bug, never the client's doing: log it, answer without a stack trace.
            log.exception("unhandled error on %s %s", scope.method, scope.path)
            try:
                send_problem(proto, ProblemError("internal_error", "the service failed on this request"))
            except Exception:  # the response had already started
                pass
