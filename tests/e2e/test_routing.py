"""Routing between replicas (issue 40, docs/operations/replicas.md "Requests sent where their
model is"): two real `lmsp serve` replicas with `--advertise-url` on real Redis and PostgreSQL,
three copies of the embedded GGUF as three models. B has two of them loaded, A none: a request
to A for one of B's models is served by B, streamed through A intact; one marked as forwarded
already is never sent on again; the token's scope is checked by A and its quota by B; with B
killed, A serves the request itself at once."""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import assert_problem, body, parse_events, store_token
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import missing_servers, postgres_server, redis_server
from model_stores import embedded

pytestmark = pytest.mark.skipif(missing_servers() is not None, reason=str(missing_servers()))

R1, R2, R3 = "smol:r1-q4_1", "smol:r2-q4_1", "smol:r3-q4_1"
GREEDY = {"temperature": 0, "max_output_tokens": 12}
# A killed sibling's port refuses at once: the request is served here within a connect attempt
# and a load of the model (a few seconds on a loaded CI machine).
KILLED_BOUND_S = 20.0


@dataclass
class Fleet:
    a: RunningServer
    b: RunningServer
    tokens: dict[str, str]
    b_id: str

    def client(self, server: RunningServer, who: str = "full") -> httpx.Client:
        return httpx.Client(base_url=server.url, timeout=120, headers={"authorization": f"Bearer {self.tokens[who]}"})


def _replica(work: Path, models: Path, redis_url: str, postgres_url: str, *extra: str) -> RunningServer:
    work.mkdir()
    return start_server(
        work,
        "--store", postgres_url,
        "--events", redis_url,
        "--model-dir", str(models),
        "--advertise-url", "http://127.0.0.1",  # no port: the one it listens on
        "--max-loaded", "3",
        "--keep-alive", "-1",
        "--parallel", "2",
        *extra,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("routing")
    models = work / "models"
    models.mkdir()
    for model in (R1, R2, R3):  # copies, not links: a hard link is one model to discovery
        shutil.copyfile(embedded(), models / f"{model.replace(':', '-')}.gguf")
    with redis_server() as redis_url, postgres_server() as postgres_url:
        tokens = {
            "full": store_token(postgres_url, "full"),
            "rpm": store_token(postgres_url, "rpm", "--rpm", "1"),
            "reader": store_token(postgres_url, "reader", scopes="models:read"),
            "admin": store_token(postgres_url, "admin", scopes="admin"),
        }
        # B first, with its models loaded before it serves: A's first look finds them.
        b = _replica(work / "b", models, redis_url, postgres_url, "--preload", R1, "--preload", R3)
        try:
            a = _replica(work / "a", models, redis_url, postgres_url)
        except BaseException:
            b.stop()
            raise
        try:
            fleet = Fleet(a, b, tokens, "")
            with fleet.client(b) as cb:
                fleet.b_id = cb.get("/lmsp/v1/models").headers["lmsp-served-by"]
            yield fleet
        finally:
            a.stop()
            b.stop()


def _metric(fleet: Fleet, server: RunningServer, name: str, **labels: str) -> float:
    with fleet.client(server, "admin") as admin:
        text = admin.get("/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def _stream(client: httpx.Client, model: str, **headers: str) -> tuple[httpx.Response, bytes]:
    payload = {**body("Name three colors.", model=model, **GREEDY), "stream": True}
    with client.stream("POST", "/lmsp/v1/responses", json=payload, headers=headers) as response:
        raw = response.read()
    return response, raw


def _text(raw: bytes) -> str:
    events = parse_events(raw)
    assert events[-1][1] in ("response.completed", "response.incomplete"), events[-1]
    return "".join(data["delta"] for _, name, data in events if name == "response.output_text.delta")


def test_a_model_loaded_only_on_the_sibling_is_served_there_streamed_intact(fleet: Fleet) -> None:
    forwarded = _metric(fleet, fleet.a, "lmsp_forwarded_requests_total", reason="model")
    with fleet.client(fleet.a) as ca, fleet.client(fleet.b) as cb:
        via_a, raw_a = _stream(ca, R1)
        direct, raw_b = _stream(cb, R1)
        assert via_a.status_code == 200 and direct.status_code == 200
        assert via_a.headers["lmsp-served-by"] == fleet.b_id
        assert via_a.headers["content-type"].startswith("text/event-stream")
        # Every event through A as B wrote it: the same greedy text, ids in order, one end.
        assert [e[0] for e in parse_events(raw_a)] == list(range(1, len(parse_events(raw_a)) + 1))
        assert _text(raw_a) == _text(raw_b) != ""
        # A sync answer (a body with a length) is passed on whole.
        sync = ca.post("/lmsp/v1/responses", json=body("Name three colors.", model=R1, **GREEDY))
        assert sync.status_code == 200 and sync.headers["lmsp-served-by"] == fleet.b_id
        assert sync.json()["output"][0]["content"][0]["text"] == _text(raw_b)
    assert _metric(fleet, fleet.a, "lmsp_forwarded_requests_total", reason="model") == forwarded + 2
    assert _metric(fleet, fleet.a, "lmsp_model_loads_total", model=R1) == 0  # A never loaded it


def test_a_model_nobody_has_loaded_is_served_where_it_landed(fleet: Fleet) -> None:
    with fleet.client(fleet.a) as ca:
        response, raw = _stream(ca, R2)
    assert response.status_code == 200 and response.headers["lmsp-served-by"] != fleet.b_id
    assert _text(raw)
    assert _metric(fleet, fleet.a, "lmsp_model_loads_total", model=R2) == 1


def test_a_request_forwarded_once_is_never_forwarded_again(fleet: Fleet) -> None:
    """B holds R3; a request to A that says it was forwarded already is served by A, which
    loads R3 itself rather than send it back: two replicas with stale views cannot bounce it."""
    forwarded = _metric(fleet, fleet.a, "lmsp_forwarded_requests_total", reason="model")
    with fleet.client(fleet.a) as ca:
        response, raw = _stream(ca, R3, **{"lmsp-forwarded": "some-sibling"})
    assert response.status_code == 200 and response.headers["lmsp-served-by"] != fleet.b_id
    assert _text(raw)
    assert _metric(fleet, fleet.a, "lmsp_forwarded_requests_total", reason="model") == forwarded
    assert _metric(fleet, fleet.a, "lmsp_model_loads_total", model=R3) == 1


def test_the_scope_is_checked_here_and_the_quota_where_it_is_served(fleet: Fleet) -> None:
    forwarded = _metric(fleet, fleet.a, "lmsp_forwarded_requests_total", reason="model")
    with fleet.client(fleet.a, "reader") as reader:
        refused = reader.post("/lmsp/v1/responses", json=body("Hi.", model=R1, **GREEDY))
    assert_problem(refused, 403, "insufficient_scope")
    assert _metric(fleet, fleet.a, "lmsp_forwarded_requests_total", reason="model") == forwarded  # never sent on
    with fleet.client(fleet.a, "rpm") as limited:
        first = limited.post("/lmsp/v1/responses", json=body("Hi.", model=R1, **GREEDY))
        second = limited.post("/lmsp/v1/responses", json=body("Hi.", model=R1, **GREEDY))
    assert first.status_code == 200 and first.headers["lmsp-served-by"] == fleet.b_id
    assert_problem(second, 429, "rate_limit_exceeded")
    assert second.headers["lmsp-served-by"] == fleet.b_id
    assert second.headers["x-ratelimit-remaining-requests"] == "0"


def test_with_the_sibling_killed_the_request_is_served_here_at_once(fleet: Fleet) -> None:
    """Last: it kills B. Its residency entry outlives it by up to its TTL; a request sent to
    it meanwhile finds its port closed and is served here, counted as fallen back."""
    fell_back = _metric(fleet, fleet.a, "lmsp_forward_fallbacks_total", reason="unreachable")
    fleet.b.proc.send_signal(signal.SIGKILL)
    fleet.b.proc.wait(30)
    started = time.monotonic()
    with fleet.client(fleet.a) as ca:
        response, raw = _stream(ca, R1)
    took = time.monotonic() - started
    assert response.status_code == 200 and response.headers["lmsp-served-by"] != fleet.b_id
    assert _text(raw)
    assert took < KILLED_BOUND_S, took
    assert _metric(fleet, fleet.a, "lmsp_forward_fallbacks_total", reason="unreachable") == fell_back + 1
    assert _metric(fleet, fleet.a, "lmsp_model_loads_total", model=R1) == 1
