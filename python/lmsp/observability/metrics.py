"""The service's Prometheus metrics, in a registry of its own (never the process-global one, so
that two services in one process, or a library that registers its own, never mix).

Per request: a counter and a histogram of prometheus-client, updated once when the request ends.
Per generated token: nothing here; the schedulers count into `EngineStats`, read at scrape time.
Per bearer token: what security/quota.py counts, read at scrape time, labelled by the token's id
(public, 8 characters; never its secret, and not its name, which its owner may reuse): one series
per token the operator made, so the labels stay as few as the tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .engine import EngineStats

__all__ = ["GRAMMAR_OUTCOMES", "Metrics", "TokenCounts"]

# What a grammar compile came to. The engine's cache (64 grammars a model) says only how many it
# holds: once full, a hit and a compile that evicted another both leave it full.
GRAMMAR_OUTCOMES = ("compiled", "cached", "full_cache", "refused")

# Methods are labels as they are; anything else a client sends is one label, not a new series.
_METHODS = frozenset({"GET", "POST", "DELETE", "OPTIONS", "HEAD", "PUT", "PATCH"})
UNMATCHED = "(unmatched)"

# Seconds; a stream's request lasts as long as its generation.
_DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@dataclass(frozen=True)
class TokenCounts:
    """One bearer token's use since the service started (security/quota.py counts it)."""

    token: str  # its id
    requests: int
    input_tokens: int
    output_tokens: int
    in_flight: int
    limited: Mapping[str, int]  # requests refused, by the limit that refused them


class _Collected(Collector):
    def __init__(self, collect: Callable[[], Iterator[Metric]]) -> None:
        self._collect = collect

    def collect(self) -> Iterator[Metric]:
        return self._collect()


class Metrics:
    def __init__(self, loaded: Callable[[], int] = lambda: 0) -> None:
        """`loaded`: how many models are loaded now, asked at scrape time."""
        # A `_created` twin of every counter and histogram doubles what a person reads for
        # what Prometheus infers from resets anyway (this is prometheus-client's global switch).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        self.engine = EngineStats()
        self.requests = Counter(
            "lmsp_http_requests",
            "Requests answered, by route template, method and status.",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "lmsp_http_request_duration_seconds",
            "From a request's arrival to the end of its answer (a stream's last byte).",
            ["route", "method"],
            buckets=_DURATION_BUCKETS,
            registry=self.registry,
        )
        # Written on the event loop only: plain numbers, read at scrape time.
        self.streams_open = 0
        self.events_written = 0
        Gauge("lmsp_event_streams_open", "Event streams being written.", registry=self.registry).set_function(
            lambda: self.streams_open
        )
        Gauge("lmsp_models_loaded", "Models loaded now.", registry=self.registry).set_function(loaded)
        self.model_loads = Counter("lmsp_model_loads", "Models loaded.", ["model"], registry=self.registry)
        self.model_unloads = Counter("lmsp_model_unloads", "Models unloaded.", ["model"], registry=self.registry)
        self.grammars = Counter(
            "lmsp_grammar_compiles",
            "Grammars asked of a model's compiler: compiled, found in its cache, asked of a full cache "
            "(either), or refused.",
            ["model", "outcome"],
            registry=self.registry,
        )
        # Finished values the check against the whole schema refused (engine/schema_check.py):
        # `left_to_check` where the grammar left keywords to it, `grammar` where the grammar was to
        # enforce the whole schema (a defect of ours; logged with the schema's hash).
        self.schema_rejections = Counter(
            "lmsp_schema_check_rejections",
            "Finished JSON values the check against the whole schema refused: the grammar left "
            "keywords to it (left_to_check), or enforced the whole schema and still let it through (grammar).",
            ["model", "kind"],
            registry=self.registry,
        )
        # Several replicas routing (`--advertise-url`, http/forward.py): requests sent on to a
        # sibling that has their model loaded or served their conversation last, and those
        # served here instead, by why.
        self.forwarded = Counter(
            "lmsp_forwarded_requests",
            "Requests sent on to a sibling replica: it has their model loaded (model) or served "
            "their conversation last (affinity).",
            ["reason"],
            registry=self.registry,
        )
        self.forward_fallbacks = Counter(
            "lmsp_forward_fallbacks",
            "Requests served here although a sibling had their model loaded or served their "
            "conversation last: it was busy, unreachable, too slow to answer, or refused (503).",
            ["reason"],
            registry=self.registry,
        )
        # Set by the app: each token's counts, asked at scrape time.
        self.token_counts: Callable[[], Iterable[TokenCounts]] = list
        self.registry.register(_Collected(self._collect))

    def _collect(self) -> Iterator[Metric]:
        yield from self.engine.collect()
        yield CounterMetricFamily(
            "lmsp_events_written", "Server-sent events written to clients.", value=self.events_written
        )
        yield from _token_families(self.token_counts())

    # --- hooks ------------------------------------------------------------------------------

    def request_done(self, route: str | None, method: str, status: int | None, seconds: float) -> None:
        route = route or UNMATCHED
        method = method if method in _METHODS else "other"
        self.requests.labels(route, method, str(status) if status is not None else "none").inc()
        self.duration.labels(route, method).observe(seconds)

    def model_loaded(self, model_id: str) -> None:
        """Call once per load of a model (whether at start-up or on demand)."""
        self.model_loads.labels(model_id).inc()

    def model_unloaded(self, model_id: str) -> None:
        """Call once per unload (idle, evicted, or stopped)."""
        self.model_unloads.labels(model_id).inc()

    def grammar(self, model_id: str | None, outcome: str) -> None:
        self.grammars.labels(model_id or "(unknown)", outcome).inc()

    def schema_rejected(self, model_id: str | None, kind: str) -> None:
        self.schema_rejections.labels(model_id or "(unknown)", kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _token_families(counts: Iterable[TokenCounts]) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "lmsp_token_requests", "Requests for model work admitted, by bearer token id.", labels=["token"]
    )
    tokens = CounterMetricFamily(
        "lmsp_token_tokens", "Model tokens used, by bearer token id and kind (input, output).", labels=["token", "kind"]
    )
    limited = CounterMetricFamily(
        "lmsp_token_rate_limited",
        "Requests refused by the token's quota (429), by bearer token id and limit (requests, tokens, streams).",
        labels=["token", "limit"],
    )
    running = GaugeMetricFamily(
        "lmsp_token_requests_running",
        "Requests for model work a token has running, background generations included.",
        labels=["token"],
    )
    for c in counts:
        requests.add_metric([c.token], c.requests)
        tokens.add_metric([c.token, "input"], c.input_tokens)
        tokens.add_metric([c.token, "output"], c.output_tokens)
        for limit, n in c.limited.items():
            limited.add_metric([c.token, limit], n)
        running.add_metric([c.token], c.in_flight)
    yield from (requests, tokens, limited, running)
