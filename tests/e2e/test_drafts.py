"""Prompt-lookup drafts (engine/drafts.py, the scheduler's `_add_drafts`/`_advance`) on the real
model, with flash attention on (where `--draft auto` drafts: a draft position's logits are bit
for bit a lone decode's): at temperature 0 every output is the one plain decoding gives, byte
for byte, over the structured-output corpus's prompts that draft the most (as free text, and
under their schemas with fast-forward on and off), tool-call prompts, an edit that copies its
input and a loop, one at a time and four at once (where only a sequence generating alone
drafts); drafts are proposed and accepted;
and the cells of rejected drafts are gone (a next turn that reuses the slot's cache answers as
a fresh slot does)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fixture_files import json_schema_corpus
from helpers import TextSink
from lmsp._core import CompiledGrammar, Vocabulary
from lmsp.engine.chat_template import CHATML, ChatTemplate
from lmsp.engine.llama import LlamaModel
from lmsp.engine.sampling import Sampling
from lmsp.engine.scheduler import Scheduler, SchedulerConfig
from lmsp.engine.sequence import GenerationRequest
from lmsp.observability.engine import EngineStats
from lmsp.testing import worker_threads

MAX_TOKENS = 64
WAIT_S = 600
EDIT = (
    "Repeat the following text exactly, but change the word 'blue' to 'green':\n\n"
    "The old lighthouse stood at the edge of the cliff, its blue door facing the sea. Every evening "
    "the keeper climbed the narrow stairs, lit the lamp, and watched the ships pass slowly in the "
    "dark. In the morning he wrote a few lines in his book about the wind, the waves and the birds."
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_PROMPTS = ["What is the weather in Paris?", "Is it raining in Tokyo and in Oslo right now?"]
# The structured-output corpus's prompts (as free text) whose T=0 answers draft the most on the
# embedded model, runs accepted and runs cut short alike (14 to 47 draft tokens each, 2 to 9
# rejections), and one that stops after a few tokens; the other 22 drafted 0 to 10 tokens each
# and added a minute to CI for little more than what these prove.
DRAFTED = (
    "todo_list",
    "product",
    "recipe",
    "any_of_contact",
    "datetime_formats",
    "matrix",
    "pattern_properties",
    "all_of",
    "const_version",
    "calendar_week",
    "free_object",
    "json_any",
    "rgb_color",
)
# Corpus schemas whose T=0 answers under their grammar draft the most (13 to 27 draft tokens
# accepted in 64 tokens: loops, and keys the prompt spells out); the other 29 drafted 0 to 10.
GRAMMAR_DRAFTED = ("todo_list", "product", "defs_refs", "nested_company", "ipv4_hostname", "calendar_week")
# Free-text prompts: those of the corpus, tool-call prompts, the edit, and a loop the model repeats.
CASES: list[tuple[str, list[dict[str, Any]] | None]] = (
    [(case["prompt"], None) for case in json_schema_corpus() if case["name"] in DRAFTED]
    + [(text, [WEATHER]) for text in TOOL_PROMPTS]
    + [(EDIT, None), ("List the numbers: 1, 1, 1, 1, 1,", None)]
)


def _prompt(model: LlamaModel, text: str, tools: list[dict[str, Any]] | None) -> list[int]:
    template = ChatTemplate(
        model.meta("tokenizer.chat_template") or CHATML, bos_token=model.bos_text, eos_token=model.eos_text
    )
    return model.tokenize(template.render([{"role": "user", "content": text}], tools=tools), add_special=False)


def _run(
    model: LlamaModel,
    prompts: list[list[int]],
    *,
    draft_max: int,
    parallel: int,
    stop: tuple[str, ...] = (),
    budgets: list[int] | None = None,
    grammars: list[CompiledGrammar | None] | None = None,
    fast_forward: bool = False,
) -> tuple[list[tuple[str, str | None]], EngineStats]:
    """Every prompt's greedy text and finish reason, `parallel` decoded together; `budgets`:
    each one's max_tokens (else MAX_TOKENS), `grammars`: the grammar each follows."""
    stats = EngineStats()
    scheduler = Scheduler(
        model,
        SchedulerConfig(
            n_parallel=parallel,
            ctx_per_sequence=1024,
            n_threads=worker_threads(),
            max_queue=len(prompts),
            draft_max=draft_max,
            flash_attn=True,
            fast_forward=fast_forward,
            stats=stats,
        ),
        name="m",
    )
    try:
        sinks = [TextSink() for _ in prompts]
        budgets = budgets or [MAX_TOKENS] * len(prompts)
        grammars = grammars or [None] * len(prompts)
        for prompt, sink, budget, grammar in zip(prompts, sinks, budgets, grammars, strict=True):
            scheduler.submit(
                GenerationRequest(
                    prompt=prompt,
                    max_tokens=budget,
                    sink=sink,
                    sampling=Sampling(temperature=0.0),
                    stop=stop,
                    grammar=grammar,
                )
            )
        for sink in sinks:
            assert sink.ended.wait(WAIT_S)
            assert sink.error is None, sink.error
    finally:
        scheduler.close()
    return [("".join(s.text), s.reason) for s in sinks], stats


@pytest.mark.timeout(900)  # two runs of 17 prompts, one request at a time (~20 s on a quiet machine)
def test_greedy_outputs_with_drafts_equal_plain_decoding(model):
    _same_with_and_without(model, CASES, parallel=1)


def test_batched_greedy_outputs_with_drafts_equal_plain_decoding(model):
    """Four at once, admitted in the same step in both runs: while several generate, none
    drafts (beside others a draft costs a pass of its own); the edit, given the longest
    budget, drafts once it generates alone, and every text stays plain decoding's. (Prompts
    admitted while others generate are read beside whatever else is in the step, which may
    change their last bits with or without drafts: docs/operations/concurrency.md#flash-attention.)"""
    cases = CASES[-4:]
    budgets = [MAX_TOKENS if text == EDIT else 12 for text, _ in cases]
    _same_with_and_without(model, cases, parallel=4, saved=10, budgets=budgets, accepted=20)


@pytest.mark.timeout(900)
def test_greedy_outputs_under_a_grammar_with_drafts_equal_plain_decoding(model):
    """Under a JSON schema at T=0 a draft is verified by the masked argmax, which commits only
    the tokens that come out: the answers are plain constrained decoding's, byte for byte, and
    the loops the model falls into under some schemas are drafted (fast-forward on and off)."""
    cases = [case for case in json_schema_corpus() if case["name"] in GRAMMAR_DRAFTED]
    prompts = [_prompt(model, case["prompt"], None) for case in cases]
    for fast_forward in (False, True):
        vocabulary = Vocabulary(model.token_table(), model.end_tokens(), fast_forward=fast_forward)
        grammars: list[CompiledGrammar | None] = [
            vocabulary.compile_json_schema(json.dumps(case["schema"])) for case in cases
        ]
        runs = {
            draft_max: _run(
                model, prompts, draft_max=draft_max, parallel=1, grammars=grammars, fast_forward=fast_forward
            )
            for draft_max in (0, 8)
        }
        plain, drafted = runs[0][0], runs[8][0]
        differ = [(cases[i]["name"], a, b) for i, (a, b) in enumerate(zip(plain, drafted, strict=True)) if a != b]
        assert not differ, (fast_forward, differ)
        s, p = runs[8][1].model("m"), runs[0][1].model("m")
        assert s.draft_accepted > 30 and s.steps < p.steps, (fast_forward, s.draft_accepted, s.steps, p.steps)


@pytest.mark.timeout(900)
def test_long_prompts_drafted_outputs_equal_plain_decoding(model):
    """Upstream's flash attention for a lone decode step (its keys split over the threads) gave
    a row other bits than the patched kernel gives it in a drafted step's pass of several rows,
    once the cache held a few hundred cells: a tool call's arguments differed after 30 tokens.
    The patch (scripts/patches) now takes the lone step too, so a long prompt's answer is plain
    decoding's, as free text and under a grammar. (With the patch before that change, these
    three schemas' answers differed with drafts; the 12 first corpus schemas were tried.)"""
    corpus = json_schema_corpus()
    notes = "Notes from earlier, for reference only:\n\n" + "\n".join(c["prompt"] for c in corpus)
    cases = [c for c in corpus if c["name"] in ("product", "rgb_color", "event")]
    prompts = [_prompt(model, f"{notes}\n\n{text}", None) for text in [EDIT] + [c["prompt"] for c in cases]]
    assert min(map(len, prompts)) > 300  # logits differed from 180 tokens on with the old kernel
    vocabulary = Vocabulary(model.token_table(), model.end_tokens())
    grammars = [None] + [vocabulary.compile_json_schema(json.dumps(c["schema"])) for c in cases]
    runs = {n: _run(model, prompts, draft_max=n, parallel=1, grammars=grammars) for n in (0, 8)}
    assert runs[0][0] == runs[8][0]
    assert runs[8][1].model("m").draft_accepted > 20


def _same_with_and_without(
    model: LlamaModel,
    cases: list[tuple[str, Any]],
    parallel: int,
    saved: int = 40,
    budgets: list[int] | None = None,
    accepted: int = 40,
) -> None:
    prompts = [_prompt(model, text, tools) for text, tools in cases]
    plain, plain_stats = _run(model, prompts, draft_max=0, parallel=parallel, budgets=budgets)
    drafted, stats = _run(model, prompts, draft_max=8, parallel=parallel, budgets=budgets)
    differ = [(cases[i][0][:40], a, b) for i, (a, b) in enumerate(zip(plain, drafted, strict=True)) if a != b]
    assert not differ, differ
    s, p = stats.model("m"), plain_stats.model("m")
    assert p.draft_proposed == 0
    # Drafts ran and saved steps: the edit copies ~60 words of its prompt.
    assert s.draft_accepted > accepted and s.draft_proposed >= s.draft_accepted
    assert s.steps <= p.steps - saved, (s.steps, p.steps)


def test_a_stop_inside_an_accepted_run_ends_there(model):
    prompts = [_prompt(model, EDIT, None)]
    plain, _ = _run(model, prompts, draft_max=0, parallel=1, stop=("the birds",))
    drafted, _ = _run(model, prompts, draft_max=8, parallel=1, stop=("the birds",))
    assert plain == drafted and plain[0][1] == "stop" and "the birds" not in plain[0][0]


def test_rejected_drafts_leave_no_cells_behind(model):
    """A second turn starts with the first turn's prompt and output: the slot reuses its cells,
    the accepted drafts' among them. A cell of a rejected draft left in the cache, or one
    missing from it, would change the second answer (or the first)."""
    first = _prompt(model, EDIT, None)
    answers: dict[int, list[str]] = {}
    for draft_max in (0, 8):
        stats = EngineStats()
        config = SchedulerConfig(
            n_parallel=1,
            ctx_per_sequence=1024,
            n_threads=worker_threads(),
            draft_max=draft_max,
            flash_attn=True,
            stats=stats,
        )
        scheduler = Scheduler(model, config, name="m")
        try:
            prompt, texts = first, []
            for _ in range(2):
                sink = TextSink()
                request = GenerationRequest(prompt, MAX_TOKENS, sink, sampling=Sampling(temperature=0.0))
                scheduler.submit(request)
                assert sink.ended.wait(WAIT_S) and sink.error is None
                texts.append("".join(sink.text))
                turn = texts[-1] + "<|im_end|>\n<|im_start|>user\nNow say it in fewer words.<|im_end|>\n"
                prompt = first + model.tokenize(turn + "<|im_start|>assistant\n", add_special=False)
        finally:
            scheduler.close()
        answers[draft_max] = texts
        assert stats.model("m").prompt_reused >= len(first)  # the second turn reused the first's cells
    assert answers[8] == answers[0]
