"""What watching the service costs: the same streams on two services started alike, one with
metrics and the access log (the default) and one with `--no-metrics --no-access-log`, measured
in alternating rounds of one run. Figures: scripted events/s and real-model tokens/s, on ÷ off."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from bench_openai import MODEL, ROUNDS, _faces, _stream, on_off_stream_rates
from figures import KEEP_LOADED, QUICK, SCRIPTED, on_off_rates, repeated, round_order
from lmsp.observability.engine import ModelStats
from lmsp.observability.exchange import Trace
from lmsp.testing import RunningServer, start_server

SIDES = ("on", "off")
# Tokens a real-model round streams: enough steps that per-token costs show, few enough that
# ten rounds fit a loaded CI machine.
MAX_TOKENS = 48 if QUICK else 128
# A scripted round takes a fraction of a second: many of them, against the machine's noise.
SCRIPTED_ROUNDS = 3 * ROUNDS


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    common = ("--scripted-model", SCRIPTED, "--max-output-tokens", "1000000", *KEEP_LOADED)
    started = {
        "on": start_server(tmp_path_factory.mktemp("metrics-on"), *common),
        "off": start_server(tmp_path_factory.mktemp("metrics-off"), *common, "--no-metrics", "--no-access-log"),
    }
    yield started
    for srv in started.values():
        srv.stop()


def _scrape(url: str) -> None:
    """As Prometheus would between two rounds: not timed, but the service pays for it."""
    r = httpx.get(f"{url}/metrics", timeout=30)
    assert r.status_code == 200 and b"lmsp_http_requests_total" in r.content


def test_scripted_events_per_second_metrics_on_vs_off(services, figures):
    # Quick: within a POST stream's ring (65,536 events), as bench_sweep's, so that a reader the
    # shared machine slows is never a whole ring behind (a CI run lost one at 7,875 of 100,000:
    # write backpressure does not yet hold every writer, issue 38). The full run measures past it.
    n = 60_000 if QUICK else 500_000
    payload, _ = _faces(n, SCRIPTED, "!repeat tok")
    urls = {side: services[side].url for side in SIDES}
    rates = on_off_stream_rates(urls, payload, n, SCRIPTED_ROUNDS, lambda: _scrape(services["on"].url))
    on_off_rates(figures, "metrics", "scripted_stream", rates)


@pytest.mark.timeout(1800)
def test_model_tokens_per_second_metrics_on_vs_off(services, figures):
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    clients = {side: httpx.Client(base_url=services[side].url, timeout=300) for side in SIDES}
    try:
        for c in clients.values():
            c.get("/lmsp/v1/models")  # connect before timing anything
        for i in range(ROUNDS):
            for side in round_order(SIDES, i):
                # A new prompt each round: neither side reuses more of its cache than the other.
                payload, _ = _faces(MAX_TOKENS, MODEL, f"Write a long story about a dragon. Version {i}.")
                seconds, _, tail = _stream(clients[side], "/lmsp/v1/responses", payload)
                usage = orjson.loads(tail.rsplit(b"data: ", 1)[1])["usage"]
                rates[side].append(usage["output_tokens"] / seconds)
            _scrape(services["on"].url)
    finally:
        for c in clients.values():
            c.close()
    median = {side: statistics.median(r) for side, r in rates.items()}
    figures["metrics.model.on_tok_per_s"] = median["on"]
    figures["metrics.model.off_tok_per_s"] = median["off"]
    figures["metrics.on_off_tok_s_ratio"] = median["on"] / median["off"]
    repeated(figures, "metrics.model.round_ratio", [a / b for a, b in zip(rates["on"], rates["off"], strict=True)])


def test_token_hook_cost(figures):
    """What the scheduler adds per token (`Trace.token`: the request's count, the model's
    counter and one histogram), in ns, beside an empty loop; and its share of a token that
    takes 1 ms (a fast GPU decode), where a cost would first show."""
    n = 200_000 if QUICK else 1_000_000
    samples = []
    for _ in range(5):
        trace = Trace(0.0, ModelStats())
        times = [i * 1e-3 for i in range(n)]
        started = time.perf_counter()
        for _now in times:
            pass
        empty = time.perf_counter() - started
        started = time.perf_counter()
        for now in times:
            trace.token(now)
        samples.append((time.perf_counter() - started - empty) / n * 1e9)
        assert trace.output_tokens == n and trace.stats is not None and sum(trace.stats.between_tokens.counts) == n - 1
    repeated(figures, "metrics.token_hook_ns", samples)
    figures["metrics.token_hook_share_of_1ms_token"] = figures["metrics.token_hook_ns"] / 1e6
