"""Streams of the real embedded model, read the same way from lmsp and from llama.cpp's own
llama-server: (seconds to the first token, tokens) per stream, and N streams at once."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from figures import QUICK
from lmsp.engine.chat_template import ChatTemplate
from lmsp.engine.llama import LlamaModel
from lmsp.engine.registry import embedded_model_path

__all__ = [
    "MODEL",
    "PROMPTS",
    "TOKENS",
    "Stream",
    "chat_history_stream",
    "engine_seconds",
    "fan_out",
    "host_share",
    "llama_server_stream",
    "lmsp_stream",
    "render",
]

MODEL = "smollm2:135m-instruct-q4_1"
TOKENS = 64 if QUICK else 128
PROMPTS = [
    "Write a story about a dragon who learns to sing.",
    "Explain how a steam engine works.",
    "Describe a walk through a busy market.",
    "Write a letter to a friend about a trip to the sea.",
    "Tell the history of the bicycle.",
    "Describe how bread is baked.",
    "Write a poem about autumn leaves.",
    "Explain why the sky is blue.",
]

# (server URL, input) -> (seconds to the first token, tokens)
Stream = Callable[[str, str], tuple[float, int]]


def _user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


def lmsp_stream(url: str, text: str) -> tuple[float, int]:
    """(seconds to first token, tokens) for one streamed response from lmsp."""
    payload = {"model": MODEL, "input": _user(text), "max_output_tokens": TOKENS, "temperature": 0, "stream": True}
    started = time.perf_counter()
    first = 0.0
    tail = b""
    with httpx.Client(timeout=600) as c, c.stream("POST", f"{url}/lmsp/v1/responses", json=payload) as r:
        if r.status_code != 200:
            raise AssertionError(f"lmsp answered {r.status_code}: {r.read().decode()}")
        for chunk in r.iter_raw():
            if not first and b"output_text.delta" in chunk:
                first = time.perf_counter() - started
            tail = (tail + chunk)[-4096:]
    final = orjson.loads(tail.rsplit(b"data: ", 1)[1])
    return first, int(final["usage"]["output_tokens"])


def llama_server_stream(url: str, prompt: str) -> tuple[float, int]:
    """The same for llama-server's /completion, fed the same chat prompt rendered (`render`)."""
    payload = {"prompt": prompt, "n_predict": TOKENS, "temperature": 0, "stream": True, "cache_prompt": True}
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    with httpx.Client(timeout=600) as c, c.stream("POST", f"{url}/completion", json=payload) as r:
        if r.status_code != 200:
            raise AssertionError(f"llama-server answered {r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = orjson.loads(line[6:])
            if data.get("content") and not first:
                first = time.perf_counter() - started
            if data.get("stop"):
                tokens = int(data.get("tokens_predicted") or data["timings"]["predicted_n"])
    return first, tokens


def chat_history_stream(url: str, messages: list[dict[str, str]], max_tokens: int) -> tuple[float, str, int]:
    """One Chat Completions stream of a whole conversation, read the same way from lmsp and
    from llama-server: (seconds to the first content, the reply, the cached prompt tokens)."""
    payload = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first, cached = 0.0, 0
    text: list[str] = []
    with httpx.Client(timeout=900) as c, c.stream("POST", f"{url}/v1/chat/completions", json=payload) as r:
        if r.status_code != 200:
            raise AssertionError(f"{url} answered {r.status_code}: {r.read().decode()}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter() - started
                    text.append(piece)
            usage = chunk.get("usage") or {}
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or cached
    return first, "".join(text), cached


def fan_out(fn: Stream, url: str, inputs: list[str]) -> dict[str, float]:
    """One stream per input, all at once: aggregate tokens/s over the wall time, the slowest
    stream's time to first token, and the tokens in all."""
    started = time.perf_counter()
    with ThreadPoolExecutor(len(inputs)) as pool:
        results = list(pool.map(lambda x: fn(url, x), inputs))
    wall = time.perf_counter() - started
    tokens = sum(n for _, n in results)
    return {"tok_per_s": tokens / wall, "slowest_ttft_s": max(t for t, _ in results), "tokens": tokens}


def engine_seconds(url: str) -> tuple[float, float]:
    """lmsp's scheduler time so far, from GET /metrics: (in llama_decode, on the host between
    decodes), over every model."""
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    parts = {"decode": 0.0, "host": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "lmsp_engine_step_seconds_total":
                parts[s.labels["part"]] += s.value
    return parts["decode"], parts["host"]


def host_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The host's share of the scheduler's working time between two `engine_seconds`."""
    decode, host = after[0] - before[0], after[1] - before[1]
    return host / (decode + host)


def render(texts: list[str]) -> list[str]:
    """Each text as the one user message of a chat, in the embedded model's own template: the
    prompt lmsp builds, given to llama-server as is."""
    model = LlamaModel(embedded_model_path())  # type: ignore[arg-type]
    template = ChatTemplate(
        model.meta("tokenizer.chat_template") or "", bos_token=model.bos_text, eos_token=model.eos_text
    )
    prompts = [template.render([{"role": "user", "content": t}]) for t in texts]
    model.close()
    return prompts


# The multi-turn conversations the conversations suite and the shared-tier script hold: a
# question per turn, a subject per conversation, and the words its preamble is padded with.
QUESTIONS = (
    "What should I know first?",
    "Give me one example.",
    "What is a common mistake?",
    "Sum it up in one sentence.",
)
SUBJECTS = ("sailing", "gardening", "astronomy", "pottery", "cycling", "baking", "chess", "birdwatching")
FILLER = (
    "The guide answers plainly and kindly, gives practical advice, names the tools and the steps, "
    "warns about the usual pitfalls and keeps each answer short enough to read in a minute. "
).split()


def metric_sums(url: str, wanted: dict[str, str]) -> dict[str, float]:
    """GET /metrics, each wanted series (`name` or `name{label="value"}`) summed over the
    models and other labels, under its short name."""
    got = dict.fromkeys(wanted.values(), 0.0)
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        name, _, labels = series.partition("{")
        for key, short in wanted.items():
            want_name, _, want_label = key.partition("{")
            if name == want_name and (not want_label or want_label.rstrip("}") in labels):
                got[short] += float(value)
    return got
