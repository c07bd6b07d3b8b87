"""Constrained decoding: what the grammar costs per token (mask + sample + commit, in Rust on
llama.cpp's logits), what a schema costs to compile, and a json_schema response's tokens/s
against free text from the same model in the same run."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from lmsp._core import Vocabulary
from lmsp.engine.chat_template import CHATML, ChatTemplate
from lmsp.engine.llama import Batch, Context, ContextConfig, LlamaModel
from lmsp.engine.registry import embedded_model_path
from lmsp.engine.scheduler import MIN_P

from conftest import QUICK

MODEL = "smollm2:135m-instruct-q4_1"
CORPUS: list[dict[str, Any]] = json.loads((Path(__file__).parents[1] / "tests" / "corpus" / "json_schemas.json").read_text())
ROUNDS = 2 if QUICK else 4


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _decode_under_grammar(model: LlamaModel, ctx: Context, batch: Batch, prompt: list[int], grammar: Any,
                          temperature: float, steps: list[float]) -> None:
    """One generation on a bare llama.cpp context, timing only the constraint's step."""
    ctx.forget(0)
    batch.clear()
    for i, token in enumerate(prompt):
        batch.add(token, i, 0, i == len(prompt) - 1)
    assert ctx.decode(batch) == 0
    constraint = grammar.start(temperature=temperature, seed=1, min_p=MIN_P)
    pos, index = len(prompt), len(prompt) - 1
    for _ in range(256):
        address = ctx.logits_address(index)
        started = time.perf_counter()
        token, done = constraint._step_at(address, model.n_vocab)
        steps.append(time.perf_counter() - started)
        if token < 0 or done:
            return
        batch.clear()
        index = batch.add(token, pos, 0, True)
        pos += 1
        assert ctx.decode(batch) == 0


def test_mask_and_sample_per_token(figures):
    model = LlamaModel(embedded_model_path())
    ctx = Context(model, ContextConfig(n_ctx=2048, n_seq_max=1, n_batch=512, n_threads=2))
    batch = Batch(512)
    vocabulary = Vocabulary(model.token_table(), model.end_tokens())
    template = ChatTemplate(model.meta("tokenizer.chat_template") or CHATML, bos_token=model.bos_text, eos_token=model.eos_text)
    steps: list[float] = []
    for case in CORPUS[:10] if QUICK else CORPUS:
        grammar = vocabulary.compile_json_schema(orjson.dumps(case["schema"]).decode())
        prompt = model.tokenize(template.render([{"role": "user", "content": case["prompt"]}]), add_special=False)
        for temperature in (0.0, 1.0):
            _decode_under_grammar(model, ctx, batch, prompt, grammar, temperature, steps)
    batch.close()
    ctx.close()
    figures["constrain.step.tokens_measured"] = len(steps)
    figures["constrain.step.mean_us"] = statistics.mean(steps) * 1e6
    figures["constrain.step.p50_us"] = _percentile(steps, 0.50) * 1e6
    figures["constrain.step.p99_us"] = _percentile(steps, 0.99) * 1e6
    figures["constrain.step.max_us"] = max(steps) * 1e6


def test_compile_and_first_mask(figures):
    model = LlamaModel(embedded_model_path())
    started = time.perf_counter()
    vocabulary = Vocabulary(model.token_table(), model.end_tokens())  # fresh: nothing cached
    figures["constrain.vocabulary_build_ms"] = (time.perf_counter() - started) * 1e3
    times = []
    for case in CORPUS:
        text = orjson.dumps(case["schema"]).decode()
        started = time.perf_counter()
        vocabulary.compile_json_schema(text)  # compiles and computes the first mask
        times.append(time.perf_counter() - started)
    figures["constrain.compile_first_mask.median_ms"] = statistics.median(times) * 1e3
    figures["constrain.compile_first_mask.max_ms"] = max(times) * 1e3


# A long, fixed-shape answer, so that both sides produce the same number of tokens.
_LONG_SCHEMA = {
    "type": "array",
    "items": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["name", "age"], "additionalProperties": False},
    "minItems": 12, "maxItems": 12,
}


def _post(client: httpx.Client, payload: dict[str, Any]) -> tuple[int, float]:
    started = time.perf_counter()
    r = client.post("/lmsp/v1/responses", json=payload)
    elapsed = time.perf_counter() - started
    assert r.status_code == 200, r.text
    return r.json()["usage"]["output_tokens"], elapsed


def _versus_free_text(server: Any, prompt: str, shaping: dict[str, Any], read: Any) -> tuple[float, float]:
    """Median tokens/s of a shaped answer and of free text of the same length, same prompt,
    rounds alternating so that drift in the machine hits both alike."""
    client = httpx.Client(base_url=server.url, timeout=300)
    shaped, free = [], []
    for i in range(ROUNDS):
        text = f"{prompt} ({i})"
        base = {"model": MODEL, "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}], "temperature": 0}
        tokens, elapsed = read(client, {**base, **shaping, "max_output_tokens": 1024})
        shaped.append(tokens / elapsed)
        free_tokens, elapsed = read(client, {**base, "max_output_tokens": tokens})
        free.append(free_tokens / elapsed)
    client.close()
    return statistics.median(shaped), statistics.median(free)


def test_json_schema_vs_free_text_tokens_per_second(server, figures):
    fmt = {"type": "json_schema", "json_schema": {"name": "people", "schema": _LONG_SCHEMA}}
    shaped, free = _versus_free_text(server, "List twelve people with their ages.", {"response_format": fmt}, _post)
    figures["constrain.json_schema.tok_per_s"] = shaped
    figures["constrain.free_text.tok_per_s"] = free
    figures["constrain.json_vs_text.ratio"] = shaped / free

_NOTE_TOOL = {
    "type": "function", "name": "save_notes", "description": "Save meeting notes.",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["notes"],
                   "properties": {"notes": {"type": "array", "minItems": 8, "maxItems": 8,
                                            "items": {"type": "string", "maxLength": 40}}}},
}


def _stream_tokens(client: httpx.Client, payload: dict[str, Any]) -> tuple[int, float]:
    started = time.perf_counter()
    tail = b""
    with client.stream("POST", "/lmsp/v1/responses", json={**payload, "stream": True}) as r:
        assert r.status_code == 200
        for chunk in r.iter_raw():
            tail = (tail + chunk)[-4096:]
    final = orjson.loads(tail.rsplit(b"data: ", 1)[1])
    return final["usage"]["output_tokens"], time.perf_counter() - started


def test_streamed_tool_call_vs_free_text_tokens_per_second(server, figures):
    shaping = {"tools": [_NOTE_TOOL], "tool_choice": "required"}
    shaped, free = _versus_free_text(server, "Take notes of our planning meeting.", shaping, _stream_tokens)
    figures["tools.streamed_call.tok_per_s"] = shaped
    figures["tools.free_text.tok_per_s"] = free
    figures["tools.call_vs_text.ratio"] = shaped / free
