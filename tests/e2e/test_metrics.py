"""GET /metrics: the Prometheus text format, read back with prometheus-client's own parser, and
every counter moving by exactly what the requests made between two scrapes did."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import MODEL, SCRIPTED, assert_problem, body, checked_client, make_token, stream
from lmsp.testing import RunningServer, start_server

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

RESPONSES = "/lmsp/v1/responses"


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def requests(route: str, status: int, method: str = "POST") -> dict[str, str]:
    return {"route": route, "method": method, "status": str(status)}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # Its own service: nothing another module runs moves these counters between two scrapes.
    srv = start_server(tmp_path_factory.mktemp("metrics"), "--parallel", "2", "--scripted-model", SCRIPTED)
    yield srv
    srv.stop()


@pytest.mark.model
def test_counters_move_by_exactly_what_the_requests_did(server):
    before = scrape(server.url)
    started = time.perf_counter()
    usages = []
    with checked_client(server.url) as c:
        for text in ("Name a colour.", "Name a fruit.", "Name a colour."):  # the third reuses the first's prefix
            r = c.post(RESPONSES, json=body(text, max_output_tokens=6, temperature=0))
            assert r.status_code == 200, r.text
            usages.append(r.json()["usage"])
        r, events = stream(c, body("Count to three.", max_output_tokens=6, temperature=0))
        assert r.status_code == 200
        usages.append(events[-1][2]["usage"])
    elapsed = time.perf_counter() - started
    after = scrape(server.url)

    assert delta(before, after, "lmsp_http_requests_total", **requests(RESPONSES, 200)) == 4
    assert delta(before, after, "lmsp_http_request_duration_seconds_count", route=RESPONSES, method="POST") == 4
    model = {"model": MODEL}
    outputs = [u["output_tokens"] for u in usages]
    assert delta(before, after, "lmsp_output_tokens_total", **model) == sum(outputs)
    reused = delta(before, after, "lmsp_prompt_tokens_total", source="reused", **model)
    decoded = delta(before, after, "lmsp_prompt_tokens_total", source="decoded", **model)
    assert reused == sum(u["input_tokens_details"]["cached_tokens"] for u in usages)
    assert reused > 0  # the repeated prompt came from the KV cache
    assert decoded + reused == sum(u["input_tokens"] for u in usages)
    # One first token per generation that made one, one gap per token after it.
    assert delta(before, after, "lmsp_time_to_first_token_seconds_count", **model) == sum(n > 0 for n in outputs)
    assert delta(before, after, "lmsp_time_between_tokens_seconds_count", **model) == sum(
        max(n - 1, 0) for n in outputs
    )
    assert delta(before, after, "lmsp_time_to_first_token_seconds_sum", **model) > 0
    # One request at a time, each prompt in one step: a step per token, and one more for a
    # generation that sampled its end.
    steps = delta(before, after, "lmsp_engine_steps_total", **model)
    assert sum(outputs) <= steps <= sum(outputs) + len(outputs)
    decode = delta(before, after, "lmsp_engine_step_seconds_total", part="decode", **model)
    host = delta(before, after, "lmsp_engine_step_seconds_total", part="host", **model)
    assert decode > 0 and host > 0
    assert decode + host < elapsed  # the waits between requests are neither
    # The stream's events, as the client read them; nothing else streamed meanwhile.
    assert delta(before, after, "lmsp_events_written_total") == len(events)
    assert value(after, "lmsp_event_streams_open") == 0
    assert value(after, "lmsp_queue_depth", **model) == 0
    assert value(after, "lmsp_slots_busy", **model) == 0
    assert value(after, "lmsp_slots", **model) == 2
    assert value(after, "lmsp_models_loaded") == 2  # the embedded model and the scripted one


def test_routes_are_labelled_by_template_and_refusals_by_status(server):
    before = scrape(server.url)
    unknown = f"no-such-model-{uuid.uuid4().hex}"
    with checked_client(server.url) as c:
        for _ in range(3):
            assert_problem(c.get(f"/lmsp/v1/models/{unknown}"), 404, "model_not_found")
        assert_problem(c.post(RESPONSES, json=body("hi", model=unknown)), 404, "model_not_found", "model")
        assert_problem(c.get(f"/nowhere/{unknown}"), 404, "not_found")
        assert_problem(c.delete("/lmsp/v1/models"), 405, "method_not_allowed")
        assert_problem(c.request("BREW", "/lmsp/v1/models"), 405, "method_not_allowed")
        r, events = stream(c, body("one two three", model=SCRIPTED))
        assert r.status_code == 200
    after = scrape(server.url)
    assert delta(before, after, "lmsp_http_requests_total", **requests("/lmsp/v1/models/{model_id}", 404, "GET")) == 3
    assert delta(before, after, "lmsp_http_requests_total", **requests(RESPONSES, 404)) == 1
    assert delta(before, after, "lmsp_http_requests_total", **requests(RESPONSES, 200)) == 1
    assert delta(before, after, "lmsp_http_requests_total", **requests("(unmatched)", 404, "GET")) == 1
    # A method is no route of its own; one a client makes up is not a series of its own.
    assert delta(before, after, "lmsp_http_requests_total", **requests("(unmatched)", 405, "DELETE")) == 1
    assert delta(before, after, "lmsp_http_requests_total", **requests("(unmatched)", 405, "other")) == 1
    assert delta(before, after, "lmsp_events_written_total") == len(events)
    # The scrape before this one counts too; the path a client chose is never a label.
    assert delta(before, after, "lmsp_http_requests_total", **requests("/metrics", 200, "GET")) == 1
    assert not any(unknown in v for _, labels in after for _, v in labels)


@pytest.mark.model
def test_grammar_compiles_then_hits_the_cache(server):
    # A schema no other test compiled: the first request compiles it, the second finds it.
    name = f"k{uuid.uuid4().hex[:8]}"
    schema = {
        "type": "object",
        "properties": {name: {"type": "integer"}},
        "required": [name],
        "additionalProperties": False,
    }
    request = body(
        "Give a number.",
        max_output_tokens=12,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    before = scrape(server.url)
    with checked_client(server.url) as c:
        for _ in range(2):
            assert c.post(RESPONSES, json=request).status_code == 200
    after = scrape(server.url)
    assert delta(before, after, "lmsp_grammar_compiles_total", model=MODEL, outcome="compiled") == 1
    assert delta(before, after, "lmsp_grammar_compiles_total", model=MODEL, outcome="cached") == 1


def test_metrics_need_the_admin_scope_once_tokens_exist(tmp_path):
    data_dir = tmp_path / "data"
    admin = make_token(data_dir, "admin")
    user_token = make_token(data_dir, "models:read,responses:write,responses:read")
    server = start_server(tmp_path, "--data-dir", str(data_dir), "--scripted-model", SCRIPTED)
    try:
        with checked_client(server.url) as c:
            r = c.get("/metrics", headers={"authorization": f"Bearer {user_token}"})
            doc = assert_problem(r, 403, "insufficient_scope", "Authorization")
            assert "admin" in doc["detail"]
            assert r.headers["www-authenticate"] == 'Bearer realm="lmsp", error="insufficient_scope", scope="admin"'
            assert_problem(c.get("/metrics"), 401, "authentication_required", "Authorization")
        samples = scrape(server.url, {"authorization": f"Bearer {admin}"})
        # The refusals were counted: the 403 under its route; a 401 comes before routing (ours,
        # and the start-up probe's that waited for the service to answer).
        assert value(samples, "lmsp_http_requests_total", **requests("/metrics", 403, "GET")) == 1
        assert value(samples, "lmsp_http_requests_total", **requests("(unmatched)", 401, "GET")) == 2
    finally:
        server.stop()


def test_no_metrics_answers_404(tmp_path):
    server = start_server(tmp_path, "--no-metrics", "--scripted-model", SCRIPTED)
    try:
        with checked_client(server.url) as c:
            assert_problem(c.get("/metrics"), 404, "not_found")
            assert c.post(RESPONSES, json=body("still serves", model=SCRIPTED)).status_code == 200
    finally:
        server.stop()


@pytest.mark.model
def test_loads_and_unloads_are_counted(tmp_path):
    # Unloaded as soon as nobody holds it: each request loads the model and lets it go again.
    server = start_server(tmp_path, "--keep-alive", "0", "--no-discover")
    loaded = {"model": MODEL}
    try:
        with checked_client(server.url) as c:
            for _ in range(2):
                assert c.post(RESPONSES, json=body("Hi.", max_output_tokens=2)).status_code == 200
        deadline = time.monotonic() + 60
        while value(samples := scrape(server.url), "lmsp_model_unloads_total", **loaded) < 3:
            assert time.monotonic() < deadline, samples
            time.sleep(0.1)
        # Loaded before serving and let go at once, then once per request.
        assert value(samples, "lmsp_model_loads_total", **loaded) == 3
        assert value(samples, "lmsp_model_unloads_total", **loaded) == 3
        assert value(samples, "lmsp_models_loaded") == 0
        assert ("lmsp_slots", frozenset(loaded.items())) not in samples  # no scheduler to ask
    finally:
        server.stop()
