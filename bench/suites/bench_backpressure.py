"""What the write-side backpressure costs a reader that keeps up (issue 28): the same streams
on two services started alike, one with the default `--max-stream-buffer` (1 MiB: each
stream's drain measured, http/outflow.py) and one with `--max-stream-buffer 0` (written as
granian takes it, unbounded), measured in alternating rounds of one run. Figures: events/s
of a finished scripted task's events read whole (the path whose drain is measured, sliced at
64 KiB), events/s of a scripted `POST /lmsp/v1/responses` stream read as it is generated (a
writer that waits for its reader unless its ring is about to drop what it has not sent), and
the real model's aggregate tokens/s at 8 streams (`--parallel 8`: Chat Completions streams,
whose writes are measured), on ÷ off."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import pytest

from bench_openai import MODEL, _faces, _stream, on_off_stream_rates
from figures import KEEP_LOADED, QUICK, SCRIPTED, on_off_rates, repeated, round_order
from lmsp.testing import RunningServer, start_server

SIDES = ("on", "off")
STREAMS = 8
# A real-model round: 8 streams of MAX_TOKENS each; few rounds in quick mode (CI), where
# 8 streams on a 2-core machine run at ~10 tokens/s in all.
MAX_TOKENS = 16 if QUICK else 128
MODEL_ROUNDS = 2 if QUICK else 7
# A scripted round takes a fraction of a second: more of them, against the machine's noise.
EVENTS = 50_000 if QUICK else 60_000  # within a task's ring (--task-events-max 65,536)
SCRIPTED_ROUNDS = 6 if QUICK else 15
# Each of 8 streams at once: a quarter of EVENTS, so that a round takes as long as one stream.
STREAM_EVENTS = EVENTS // 4


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, RunningServer]]:
    common = ("--scripted-model", SCRIPTED, "--max-output-tokens", "1000000", "--parallel", str(STREAMS))
    started = {
        "on": start_server(tmp_path_factory.mktemp("backpressure-on"), *common, *KEEP_LOADED),
        "off": start_server(
            tmp_path_factory.mktemp("backpressure-off"), *common, *KEEP_LOADED, "--max-stream-buffer", "0"
        ),
    }
    yield started
    for srv in started.values():
        srv.stop()


def _task_events(client: httpx.Client, task_id: str) -> tuple[float, int, bytes]:
    """(seconds, events, the last bytes) of one read of a finished task's events."""
    started = time.perf_counter()
    events = 0
    last = tail = b""
    with client.stream("GET", f"/lmsp/v1/tasks/{task_id}/events") as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            events += (last + chunk).count(b"\n\n")
            last = chunk[-1:]
            tail = (tail + chunk)[-4096:]
    return time.perf_counter() - started, events, tail


def test_scripted_events_per_second_backpressure_on_vs_off(services, figures):
    """A finished task's events read whole (written as fast as the reader takes them), the
    path whose drain is measured; the task runs once per side, untimed."""
    payload, _ = _faces(EVENTS, SCRIPTED, "!repeat tok")
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    clients = {side: httpx.Client(base_url=services[side].url, timeout=300) for side in SIDES}
    try:
        tasks = {}
        for side, c in clients.items():
            created = c.post("/lmsp/v1/tasks", json=payload)
            assert created.status_code == 202, created.text
            tasks[side] = created.json()["id"]
            deadline = time.monotonic() + 120
            while c.get(f"/lmsp/v1/tasks/{tasks[side]}").json()["response"] is None:
                assert time.monotonic() < deadline, "the task did not end"
                time.sleep(0.1)
        for i in range(SCRIPTED_ROUNDS):
            for side in round_order(SIDES, i):
                seconds, events, tail = _task_events(clients[side], tasks[side])
                assert events == EVENTS + 4, tail
                rates[side].append(events / seconds)
    finally:
        for c in clients.values():
            c.close()
    on_off_rates(figures, "backpressure", "task_events", rates)


def test_scripted_post_stream_events_per_second_backpressure_on_vs_off(services, figures):
    """A POST stream read as its generation (~1M events/s on the scripted model, faster than
    any reader) writes it: every event arrives on both sides, none lost to the ring."""
    payload, _ = _faces(EVENTS, SCRIPTED, "!repeat tok")
    urls = {side: services[side].url for side in SIDES}
    rates = on_off_stream_rates(urls, payload, EVENTS, SCRIPTED_ROUNDS)
    on_off_rates(figures, "backpressure", "post_stream", rates, ratio="post_stream_on_off_events_s_ratio")


def _eight_scripted_streams(url: str, payload: dict[str, Any]) -> float:
    """Events/s in all of STREAMS scripted `POST /lmsp/v1/responses` streams started together,
    each read whole as it is generated."""

    def one(_: int) -> int:
        with httpx.Client(base_url=url, timeout=300) as c:
            _, events, tail = _stream(c, "/lmsp/v1/responses", payload)
        assert events == STREAM_EVENTS + 4, tail
        return events

    started = time.perf_counter()
    with ThreadPoolExecutor(STREAMS) as pool:
        events = sum(pool.map(one, range(STREAMS)))
    return events / (time.perf_counter() - started)


def test_scripted_events_per_second_at_8_streams_backpressure_on_vs_off(services, figures):
    """8 scripted POST streams at once, each measured (the kernel asked once its reader may be
    over its window, issue 38), against the same streams unmeasured: the figure users
    benchmark, held to 0.95x (bench/scripts/report.py TARGETS)."""
    payload, _ = _faces(STREAM_EVENTS, SCRIPTED, "!repeat tok")
    for srv in services.values():
        _eight_scripted_streams(srv.url, payload)  # warm: every slot has run once
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(SCRIPTED_ROUNDS):
        for side in round_order(SIDES, i):
            rates[side].append(_eight_scripted_streams(services[side].url, payload))
    on_off_rates(figures, "backpressure", "streams_8", rates, ratio="streams_8_on_off_events_s_ratio")


def _eight_streams(url: str, round_: int, max_tokens: int = MAX_TOKENS) -> float:
    """Aggregate output tokens/s of STREAMS streams started together, each its own prompt."""

    def one(k: int) -> int:
        text = f"Write a long story about a dragon. Version {round_}.{k}."
        payload = {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream_options": {"include_usage": True},
        }
        with httpx.Client(base_url=url, timeout=300) as c:
            _, _, tail = _stream(c, "/v1/chat/completions", payload)
        usage = next(
            orjson.loads(part)["usage"]
            for part in reversed(tail.split(b"data: "))
            if part.startswith(b'{"') and b'"usage":{' in part
        )
        return int(usage["completion_tokens"])

    started = time.perf_counter()
    with ThreadPoolExecutor(STREAMS) as pool:
        tokens = sum(pool.map(one, range(STREAMS)))
    return tokens / (time.perf_counter() - started)


@pytest.mark.timeout(1800)
def test_model_tokens_per_second_at_8_streams_backpressure_on_vs_off(services, figures):
    for srv in services.values():
        _eight_streams(srv.url, -1, 2)  # warm: every slot has run once before anything is timed
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    for i in range(MODEL_ROUNDS):
        for side in round_order(SIDES, i):
            rates[side].append(_eight_streams(services[side].url, i))
    median = {side: statistics.median(r) for side, r in rates.items()}
    figures["backpressure.model_8_streams.on_tok_per_s"] = median["on"]
    figures["backpressure.model_8_streams.off_tok_per_s"] = median["off"]
    figures["backpressure.on_off_tok_s_ratio"] = median["on"] / median["off"]
    ratios = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    repeated(figures, "backpressure.model_8_streams.round_ratio", ratios)
