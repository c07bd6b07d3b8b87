"""Watches each request from arrival to the end of its answer: the status it got, the events a
stream wrote, then one access line and the request metrics.

granian's protocol object is wrapped (as `WithHeaders` does for CORS) so that whatever sends
the answer, a route, a problem document or a stream, the status is seen where it is sent.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from .accesslog import ACCESS_LOGGER, access_fields, text_line
from .exchange import Exchange, enter, leave
from .metrics import Metrics

__all__ = ["Observer", "Watched"]


class _Transport:
    """A stream's transport, counting the events it writes. An event is one `data:` line:
    JSON data never holds a raw newline, so `\\ndata:` starts a line, and keep-alive comments
    have none."""

    __slots__ = ("_metrics", "_transport")

    def __init__(self, transport: Any, metrics: Metrics) -> None:
        self._transport = transport
        self._metrics = metrics

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    async def send_bytes(self, data: bytes) -> None:
        await self._transport.send_bytes(data)
        self._metrics.events_written += data.count(b"\ndata:") + data.startswith(b"data:")


class Watched:
    """granian's protocol object for one request, noting the status of whatever answer goes
    out; `exchange` is the request as the access log and the metrics see it."""

    __slots__ = ("_metrics", "_proto", "_stream", "_token", "exchange")

    def __init__(self, proto: Any, exchange: Exchange, metrics: Metrics | None) -> None:
        self._proto = proto
        self.exchange = exchange
        self._metrics = metrics
        self._stream = False
        self._token = enter(exchange)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._proto, name)

    def __aiter__(self) -> Any:
        return self._proto.__aiter__()

    def response_bytes(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.exchange.status = status
        self._proto.response_bytes(status, headers, body)

    def response_str(self, status: int, headers: list[tuple[str, str]], body: str) -> None:
        self.exchange.status = status
        self._proto.response_str(status, headers, body)

    def response_empty(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.exchange.status = status
        self._proto.response_empty(status, headers)

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> Any:
        self.exchange.status = status
        transport = self._proto.response_stream(status, headers)
        metrics = self._metrics
        if metrics is None:
            return transport
        if not self._stream:
            self._stream = True
            metrics.streams_open += 1
        return _Transport(transport, metrics)

    def close(self) -> None:
        leave(self._token)
        if self._stream and self._metrics is not None:
            self._metrics.streams_open -= 1


class Observer:
    """`metrics`: None with --no-metrics; `access`: False without an access log."""

    def __init__(self, metrics: Metrics | None, access: bool = True) -> None:
        self.metrics = metrics
        self._log = logging.getLogger(ACCESS_LOGGER) if access else None

    def begin(self, scope: Any, proto: Any) -> Watched:
        """What the app answers the request through, until `end`."""
        return Watched(proto, Exchange(scope.method, scope.path, self.metrics), self.metrics)

    def end(self, watched: Watched) -> None:
        watched.close()
        exchange = watched.exchange
        seconds = time.perf_counter() - exchange.started
        if self.metrics is not None:
            self.metrics.request_done(exchange.route, exchange.method, exchange.status, seconds)
        if self._log is not None:
            fields = access_fields(exchange, seconds)
            # The message is the text line (escaped too): safe for any handler a user adds.
            self._log.info("%s", text_line(fields), extra={"lmsp": fields})
