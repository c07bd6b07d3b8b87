"""The service end to end: events/s of a scripted stream through the real server, and a real
model's tokens/s and time to first token through the service vs. llama-cpp-python directly."""

from __future__ import annotations

import statistics
import time
from typing import Any

import httpx
import orjson

from figures import QUICK, SCRIPTED
from lmsp.engine.chat_template import ChatTemplate
from lmsp.engine.registry import embedded_model_path

MODEL = "smollm2:135m-instruct-q4_1"
PROMPT = "Write a long story about a dragon who learns to sing."
MAX_TOKENS = 128
ROUNDS = 2 if QUICK else 5


def _stream(client: httpx.Client, payload: dict[str, Any]) -> tuple[float, float, int, bytes]:
    """(seconds to first delta, seconds in all, events, final event data). The client's
    connection is kept alive between calls, as a real client's would be."""
    started = time.perf_counter()
    first = 0.0
    events = 0
    tail = b""
    last = b""
    with client.stream("POST", "/lmsp/v1/responses", json={**payload, "stream": True}) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            if not first and b"output_text.delta" in chunk:
                first = time.perf_counter() - started
            events += (last + chunk).count(b"\n\n")  # a frame's end may straddle two chunks
            last = chunk[-1:]
            tail = (tail + chunk)[-4096:]
    return first, time.perf_counter() - started, events, tail


def test_scripted_stream_events_per_second(server, figures, benchmark):
    # Quick: within a POST stream's ring, as bench_metrics' and bench_openai's.
    n = 60_000 if QUICK else 500_000
    payload = {"model": SCRIPTED, "input": _user("!repeat tok"), "max_output_tokens": n}

    client = httpx.Client(base_url=server.url, timeout=300)

    def run() -> tuple[float, float, int, bytes]:
        return _stream(client, payload)

    benchmark.group = "service"
    _, _, events, tail = benchmark.pedantic(run, rounds=ROUNDS, iterations=1)
    client.close()
    assert events == n + 4, tail  # created, item added, n deltas, item done, incomplete
    figures["service.scripted_stream.events_per_s"] = (n + 4) / benchmark.stats.stats.min


def _user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


def _direct_llama() -> tuple[Any, ChatTemplate]:
    from llama_cpp import Llama

    llm = Llama(str(embedded_model_path()), n_ctx=4096, n_threads=2, n_threads_batch=2, verbose=False)
    template = ChatTemplate(
        llm.metadata["tokenizer.chat_template"],
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )
    return llm, template


def _direct_round(llm: Any, prompt: str) -> tuple[float, float, int]:
    started = time.perf_counter()
    first = 0.0
    n = 0
    for _chunk in llm.create_completion(prompt, max_tokens=MAX_TOKENS, temperature=0.0, stream=True):
        if not first:
            first = time.perf_counter() - started
        n += 1
    return first, time.perf_counter() - started, n


def test_model_stream_vs_direct(server, figures):
    llm, template = _direct_llama()
    client = httpx.Client(base_url=server.url, timeout=300)
    client.get("/lmsp/v1/models")  # connect before timing anything
    service_rates, service_ttft, direct_rates, direct_ttft = [], [], [], []
    for i in range(ROUNDS):  # alternate, so that drift in the machine hits both alike
        # A new prompt each round: both sides reuse the cached common prefix, neither the rest.
        text = f"{PROMPT} Version {i}."
        payload = {"model": MODEL, "input": _user(text), "max_output_tokens": MAX_TOKENS, "temperature": 0}
        prompt = template.render([{"role": "user", "content": text}])
        first, total, _events, tail = _stream(client, payload)
        final = orjson.loads(tail.rsplit(b"data: ", 1)[1])
        tokens = final["usage"]["output_tokens"]
        service_rates.append(tokens / total)
        service_ttft.append(first)
        first, total, tokens = _direct_round(llm, prompt)
        direct_rates.append(tokens / total)
        direct_ttft.append(first)
    client.close()
    service, direct = statistics.median(service_rates), statistics.median(direct_rates)
    figures["model.service.tok_per_s"] = service
    figures["model.direct_llama_cpp_python.tok_per_s"] = direct
    figures["model.service_vs_direct.ratio"] = service / direct
    figures["model.service.ttft_ms"] = statistics.median(service_ttft) * 1e3
    figures["model.direct_llama_cpp_python.ttft_ms"] = statistics.median(direct_ttft) * 1e3
    figures["model.ttft_overhead_ms"] = (
        figures["model.service.ttft_ms"] - figures["model.direct_llama_cpp_python.ttft_ms"]
    )
