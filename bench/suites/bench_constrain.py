"""Constrained decoding: what the grammar costs per token (mask + sample + commit, in Rust on
llama.cpp's logits), what a schema costs to compile, and a json_schema response's tokens/s
against free text from the same model in the same run."""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import llama_cpp as ll
import orjson

from figures import QUICK
from lmsp._core import Vocabulary, _greedy_at
from lmsp.engine.chat_template import CHATML, ChatTemplate
from lmsp.engine.llama import Batch, Context, ContextConfig, LlamaModel
from lmsp.engine.registry import embedded_model_path
from lmsp.engine.sampling import DEFAULT_MIN_P, Sampling
from lmsp.engine.scheduler import Scheduler, SchedulerConfig
from lmsp.engine.sequence import GenerationRequest

MODEL = "smollm2:135m-instruct-q4_1"
# The tests' schema corpus (data, read, not imported): the bench times what the tests check.
CORPUS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[2] / "tests" / "fixtures" / "corpus" / "json_schemas.json").read_text()
)
ROUNDS = 2 if QUICK else 4


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# Sequences decoded together, as the scheduler batches them: one decode per step for all.
GROUP = 8
MAX_TOKENS = 160 if QUICK else 400


@dataclass
class _Times:
    """Per step, in ns: the grammar's step and the plain sampler's on the same row, as this
    thread's CPU time (what the code costs; other processes on a shared machine do not count)
    and as wall time (what the step waited, preemption included)."""

    grammar_cpu: list[int] = field(default_factory=list)
    plain_cpu: list[int] = field(default_factory=list)
    grammar_wall: list[int] = field(default_factory=list)
    plain_wall: list[int] = field(default_factory=list)
    # At T=0 only: the argmax the scheduler now reads in place for free text (`_greedy_at`),
    # on the same rows, CPU time (the grammar's steps are `grammar_cpu` at the same indices).
    argmax_cpu: list[int] = field(default_factory=list)
    stats: list[dict[str, int]] = field(default_factory=list)

    def extend(self, other: _Times) -> None:
        for name in ("grammar_cpu", "plain_cpu", "grammar_wall", "plain_wall", "argmax_cpu", "stats"):
            getattr(self, name).extend(getattr(other, name))


def _critical_path(model: LlamaModel, vocabulary: Vocabulary, prompts: list[list[int]], temperature: float) -> _Times:
    """The corpus under its grammars on a bare llama.cpp context, GROUP sequences per decode.
    Each step, on the same live logits row, times the grammar's step (logits readable to token
    committed) and the plain sampler the scheduler uses for free text, in alternating order so
    that whichever reads the row second gets no unfair help from the cache."""
    # One decode thread: the decode is not what is timed, and on a busy machine ggml's threads
    # wait for each other's time slices.
    ctx = Context(model, ContextConfig(n_ctx=1024 * GROUP, n_seq_max=GROUP, n_batch=1024, n_threads=1))
    prefill, steps = Batch(1024), Batch(GROUP)
    times = _Times()
    flip = [False]
    live: dict[int, tuple[Any, Any, int, int]] = {}  # seq -> constraint, sampler, next pos, batch index

    def step(seq: int, state: tuple[Any, Any, int, int]) -> None:
        constraint, sampler, pos, index = state
        address = ctx.logits_address(index)
        flip[0] = not flip[0]
        argmax = None
        if flip[0]:
            if temperature == 0:
                argmax = _timed(_greedy_at, address, model.n_vocab)
            plain = _timed(ll.llama_sampler_sample, sampler, ctx.handle, index)
            grammar = _timed(constraint._step_at, address, model.n_vocab)
        else:
            grammar = _timed(constraint._step_at, address, model.n_vocab)
            plain = _timed(ll.llama_sampler_sample, sampler, ctx.handle, index)
            if temperature == 0:
                argmax = _timed(_greedy_at, address, model.n_vocab)
        if argmax is not None:
            times.argmax_cpu.append(argmax[1])
        (token, done), grammar_cpu, grammar_wall = grammar
        _, plain_cpu, plain_wall = plain
        times.grammar_cpu.append(grammar_cpu)
        times.grammar_wall.append(grammar_wall)
        times.plain_cpu.append(plain_cpu)
        times.plain_wall.append(plain_wall)
        if token < 0 or done:
            ll.llama_sampler_free(sampler)
            times.stats.append(constraint.stats)
            live.pop(seq, None)
        else:
            live[seq] = (constraint, sampler, pos + 1, steps.add(token, pos, seq, True))

    for first in range(0, len(CORPUS), GROUP):
        live.clear()
        steps.clear()
        for seq, case_index in enumerate(range(first, min(first + GROUP, len(CORPUS)))):
            ctx.forget(seq)
            prefill.clear()
            prompt = prompts[case_index]
            for i, token in enumerate(prompt):
                prefill.add(token, i, seq, i == len(prompt) - 1)
            assert ctx.decode(prefill) == 0
            grammar = vocabulary.compile_json_schema(orjson.dumps(CORPUS[case_index]["schema"]).decode())
            constraint = grammar.start(temperature=temperature, seed=1 + case_index, min_p=DEFAULT_MIN_P)
            # The next prompt's decode replaces these logits: its first token is sampled now.
            step(
                seq,
                (constraint, _plain_sampler(temperature, 1 + case_index, model.n_vocab), len(prompt), len(prompt) - 1),
            )
        for _ in range(MAX_TOKENS):
            if not live:
                break
            assert ctx.decode(steps) == 0
            steps.clear()  # the rows stay readable in the context until the next decode
            for seq, state in list(live.items()):
                step(seq, state)
        for constraint, sampler, _, _ in live.values():
            times.stats.append(constraint.stats)
            ll.llama_sampler_free(sampler)
    steps.close()
    prefill.close()
    ctx.close()
    return times


def _plain_sampler(temperature: float, seed: int, n_vocab: int) -> Any:
    """llama.cpp's sampler for free text: the baseline issue 19's figures are defined against
    (at T=0 its greedy sampler; the scheduler itself now reads the argmax in place, which the
    `t0_vs_argmax` figures compare with)."""
    if temperature > 0:
        return Scheduler._make_sampler(Sampling(temperature=temperature), seed, n_vocab)
    chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
    ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
    return chain


def _timed(fn: Any, *args: Any) -> tuple[Any, int, int]:
    cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
    result = fn(*args)
    return result, time.thread_time_ns() - cpu, time.perf_counter_ns() - wall


def _ratio_figures(figures: dict[str, Any], label: str, times: _Times) -> None:
    """`p99_ratio`: the 99th percentile of grammar ÷ plain per step (the same row); `mean_ratio`:
    all grammar time ÷ all plain time; `p99_over_p99`: the two 99th percentiles' ratio."""
    for clock in ("cpu", "wall"):
        grammar, plain = getattr(times, f"grammar_{clock}"), getattr(times, f"plain_{clock}")
        suffix = "" if clock == "cpu" else "_wall"
        figures[f"{label}_p99_ratio{suffix}"] = _percentile(
            [g / max(p, 1) for g, p in zip(grammar, plain, strict=True)], 0.99
        )
        figures[f"{label}_mean_ratio{suffix}"] = sum(grammar) / sum(plain)
        figures[f"{label}_p99_over_p99{suffix}"] = _percentile(grammar, 0.99) / _percentile(plain, 0.99)


def test_grammar_on_the_critical_path_vs_plain_sampling(figures):
    """The grammar's time from a sequence's logits to its committed token, over the corpus at
    T=0 and T=1, against llama.cpp's sampler on the same rows (issue 19's baseline; free text
    at T>0 uses it); both ratios are of the same statistic over the same steps. At T=0 also
    against the argmax free text now reads in place (`t0_vs_argmax`). CPU time is the headline (a shared
    machine's other processes preempt both alike, but not evenly per step); wall time too."""
    model = LlamaModel(embedded_model_path())
    vocabulary = Vocabulary(model.token_table(), model.end_tokens())
    template = ChatTemplate(
        model.meta("tokenizer.chat_template") or CHATML, bos_token=model.bos_text, eos_token=model.eos_text
    )
    prompts = [
        model.tokenize(template.render([{"role": "user", "content": case["prompt"]}]), add_special=False)
        for case in CORPUS
    ]
    everything = _Times()
    for temperature in (0.0, 1.0):
        times = _critical_path(model, vocabulary, prompts, temperature)
        _ratio_figures(figures, f"constrain.critical_path.t{temperature:g}", times)
        everything.extend(times)
        if times.argmax_cpu:  # T=0: the grammar against free text's in-place argmax
            grammar, argmax = times.grammar_cpu, times.argmax_cpu
            figures["constrain.critical_path.t0_vs_argmax_p99_ratio"] = _percentile(
                [g / max(a, 1) for g, a in zip(grammar, argmax, strict=True)], 0.99
            )
            figures["constrain.critical_path.t0_vs_argmax_mean_ratio"] = sum(grammar) / sum(argmax)
            figures["constrain.argmax.mean_us"] = statistics.mean(argmax) / 1e3
            figures["constrain.argmax.p99_us"] = _percentile(argmax, 0.99) / 1e3
    model.close()
    _ratio_figures(figures, "constrain.critical_path", everything)
    grammar, plain = everything.grammar_cpu, everything.plain_cpu
    figures["constrain.step.tokens_measured"] = len(grammar)
    for name, values in (("step", grammar), ("plain_sampler", plain)):
        figures[f"constrain.{name}.mean_us"] = statistics.mean(values) / 1e3
        figures[f"constrain.{name}.p50_us"] = _percentile(values, 0.50) / 1e3
        figures[f"constrain.{name}.p99_us"] = _percentile(values, 0.99) / 1e3
        figures[f"constrain.{name}.max_us"] = max(values) / 1e3
    # Where the grammar's time goes, per step (the rest of a step is the binding's call).
    stats = {key: sum(s[key] for s in everything.stats) for key in everything.stats[0]}
    figures["constrain.step.masked_share"] = stats["masks"] / stats["steps"]
    for key in ("sample_ns", "check_ns", "mask_ns", "commit_ns"):
        figures[f"constrain.step.{key[:-3]}_mean_us"] = stats[key] / stats["steps"] / 1e3
    figures["constrain.step.mask_when_masked_mean_us"] = stats["mask_ns"] / max(1, stats["masks"]) / 1e3


class _Collect:
    """A sink that only notes when its sequence is over."""

    def __init__(self, done: threading.Semaphore) -> None:
        self.done = done
        self.error: str | None = None

    def on_text(self, text: str) -> None:
        pass

    def on_finish(self, reason: str, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> None:
        self.done.release()

    def on_error(self, message: str) -> None:
        self.error = message
        self.done.release()


def _scheduler_steps(model: LlamaModel, requests: list[dict[str, Any]]) -> list[tuple[int, int, int, int, int]]:
    """Runs the requests through the real scheduler, all at once, and returns per step:
    (sequences sampled, step CPU ns, decode CPU ns, step wall ns, decode wall ns), for the
    steps that only generated (no prompt read), where all of a step but the decode is the
    per-sequence work the scheduler does (batch entry, sampling or grammar, text, stops)."""
    # One decode thread, as in the critical-path bench: the decode is what this leaves out.
    scheduler = Scheduler(model, SchedulerConfig(n_parallel=len(requests), ctx_per_sequence=1024, n_threads=1))
    records: list[tuple[int, int, int, int, int]] = []
    decode_times: list[tuple[int, int]] = []
    sampled = [0]
    step, decode, advance = scheduler._step, scheduler.ctx.decode, scheduler._advance

    def timed_decode(batch: Batch) -> int:
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        rc = decode(batch)
        decode_times.append((time.thread_time_ns() - cpu, time.perf_counter_ns() - wall))
        return rc

    def counted_advance(slot: Any) -> None:
        sampled[0] += 1
        advance(slot)

    def timed_step() -> None:
        decode_times.clear()
        sampled[0] = 0
        cpu, wall = time.thread_time_ns(), time.perf_counter_ns()
        step()
        cpu, wall = time.thread_time_ns() - cpu, time.perf_counter_ns() - wall
        if decode_times and sampled[0] == scheduler.batch.n:
            records.append((sampled[0], cpu, decode_times[0][0], wall, decode_times[0][1]))

    scheduler.ctx.decode, scheduler._advance, scheduler._step = timed_decode, counted_advance, timed_step  # type: ignore[method-assign]
    done = threading.Semaphore(0)
    sinks = [_Collect(done) for _ in requests]
    for request, sink in zip(requests, sinks, strict=True):
        scheduler.submit(GenerationRequest(sink=sink, **request))
    for _ in requests:
        assert done.acquire(timeout=600)
    scheduler.close()
    assert not [s.error for s in sinks if s.error]
    return records


def test_scheduler_overhead_per_sequence_step_at_8_streams(figures):
    """All of a step but llama_decode, per sequence: with a GPU's decode time d per step, a
    step of n streams costs about d + n times this."""
    model = LlamaModel(embedded_model_path())
    vocabulary = Vocabulary(model.token_table(), model.end_tokens())
    template = ChatTemplate(
        model.meta("tokenizer.chat_template") or CHATML, bos_token=model.bos_text, eos_token=model.eos_text
    )
    cases = CORPUS[:8]
    tokens = 48 if QUICK else 128
    for temperature in (0.0, 1.0):
        base = [
            {
                "prompt": model.tokenize(
                    template.render([{"role": "user", "content": c["prompt"]}]), add_special=False
                ),
                "max_tokens": tokens,
                "sampling": Sampling(temperature=temperature, seed=1),
            }
            for c in cases
        ]
        shaped = [
            {**r, "grammar": vocabulary.compile_json_schema(orjson.dumps(c["schema"]).decode())}
            for r, c in zip(base, cases, strict=True)
        ]
        for label, requests in (("free", base), ("constrained", shaped)):
            records = _scheduler_steps(model, requests)
            full = [r for r in records if r[0] == len(cases)] or records
            name = f"constrain.scheduler_8_streams.t{temperature:g}.{label}"
            figures[f"{name}.overhead_per_seq_us"] = (
                statistics.median((cpu - dcpu) / n for n, cpu, dcpu, _, _ in full) / 1e3
            )
            figures[f"{name}.overhead_per_seq_wall_us"] = (
                statistics.median((wall - dwall) / n for n, _, _, wall, dwall in full) / 1e3
            )
            figures[f"{name}.decode_wall_ms"] = statistics.median(dwall for *_, dwall in full) / 1e6
            figures[f"{name}.steps_measured"] = len(full)
    model.close()


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
    "items": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "minItems": 12,
    "maxItems": 12,
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
        base = {
            "model": MODEL,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}],
            "temperature": 0,
        }
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
    "type": "function",
    "name": "save_notes",
    "description": "Save meeting notes.",
    "parameters": {
        "type": "object",
        "additionalProperties": False,
        "required": ["notes"],
        "properties": {
            "notes": {"type": "array", "minItems": 8, "maxItems": 8, "items": {"type": "string", "maxLength": 40}}
        },
    },
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
