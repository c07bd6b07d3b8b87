"""One request as the access log and the metrics see it, and the generations it started.

The app opens an `Exchange` when a request arrives and keeps it in a context variable while
the request is answered, so that code deep below (the model manager, the grammar compiler, the
scheduler's `submit`) can note what it learns without any signature carrying it. A `Trace` is
one generation: written by the scheduler's thread, read when the request ends.
"""

from __future__ import annotations

import time
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .engine import ModelStats
    from .metrics import Metrics

__all__ = ["Exchange", "Trace", "current", "drop_trace", "enter", "leave", "note_model", "start_trace"]


class Trace:
    """One generation's times (perf_counter seconds) and token counts."""

    __slots__ = ("first_at", "input_tokens", "last_at", "output_tokens", "stats", "t0")

    def __init__(self, t0: float, stats: ModelStats | None) -> None:
        self.t0 = t0  # when the request that asked for it arrived
        self.stats = stats
        self.first_at: float | None = None
        self.last_at = 0.0
        self.input_tokens = 0
        self.output_tokens = 0

    def token(self, now: float) -> None:
        """A token sampled at `now` (the end of its step's decode): once per token, cheap."""
        self.output_tokens += 1
        stats = self.stats
        if stats is not None:
            stats.output_tokens += 1
            if self.first_at is None:
                stats.first_token.add(now - self.t0)
            else:
                stats.between_tokens.add(now - self.last_at)
        if self.first_at is None:
            self.first_at = now
        self.last_at = now


class Exchange:
    """A request being answered: what the access line and the request metrics need."""

    __slots__ = ("metrics", "method", "model", "path", "route", "started", "status", "token_id", "traces")

    def __init__(self, method: str, path: str, metrics: Metrics | None) -> None:
        self.method = method
        self.path = path  # as the client sent it: escaped when written
        self.metrics = metrics
        self.started = time.perf_counter()
        self.route: str | None = None  # the route's template: the metrics' label, never the path
        self.status: int | None = None
        self.model: str | None = None  # the model the request named, as it named it
        self.token_id: str | None = None
        self.traces: list[Trace] = []


_current: ContextVar[Exchange | None] = ContextVar("lmsp_exchange", default=None)


def current() -> Exchange | None:
    return _current.get()


def enter(exchange: Exchange) -> Token[Exchange | None]:
    return _current.set(exchange)


def leave(token: Token[Exchange | None]) -> None:
    _current.reset(token)


def note_model(model_id: str) -> None:
    """The model the current request asked for (the first one it names)."""
    exchange = _current.get()
    if exchange is not None and exchange.model is None:
        exchange.model = model_id


def start_trace(model: str, stats: ModelStats | None) -> Trace | None:
    """A generation of `model` submitted now: traced for the current request, and for the
    model's metrics when `stats` is given; None when neither wants it."""
    exchange = _current.get()
    if exchange is None:
        return Trace(time.perf_counter(), stats) if stats is not None else None
    if exchange.model is None:
        exchange.model = model
    trace = Trace(exchange.started, stats)
    exchange.traces.append(trace)
    return trace


def drop_trace(trace: Trace) -> None:
    """A generation that was refused (a full queue): the request made none."""
    exchange = _current.get()
    if exchange is not None and trace in exchange.traces:
        exchange.traces.remove(trace)
