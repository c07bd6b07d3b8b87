"""The sampling controls on the real model, driven straight through the scheduler: each one
changes the output as llama.cpp's sampler of that name does, on free text (llama.cpp's sampler
chain) and under a grammar (lmsp-constrain's sampler), and the grammar still holds under each.
The faces' names for them are tested over HTTP elsewhere (test_sampling.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest

from helpers import TextSink
from lmsp._core import CompiledGrammar, Vocabulary
from lmsp.engine.chat_template import CHATML, ChatTemplate
from lmsp.engine.llama import LlamaModel
from lmsp.engine.sampling import Sampling
from lmsp.engine.scheduler import Scheduler, SchedulerConfig
from lmsp.engine.sequence import GenerationRequest
from lmsp.testing import worker_threads

MAX_TOKENS = 48
STORY = "Write a short story about a dragon who learns to paint."
# The model at temperature 0 answers this with "1, " over and over, to the last token.
LOOP = "List the numbers: 1, 1, 1, 1, 1,"
LOOP_WORD = "1,"
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "colors": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 4},
    },
    "required": ["name", "colors"],
    "additionalProperties": False,
}
SHAPED = "Describe a painter and the colors she likes, as JSON."
# Room for the longest value the schema allows, so a cut-off output is a failure of the grammar.
SHAPED_TOKENS = 120
# Generous: on a loaded 2-core machine one generation took up to ~35 s.
WAIT_S = 300


@pytest.fixture(scope="module")
def scheduler(model: LlamaModel) -> Iterator[Scheduler]:
    scheduler = Scheduler(
        model, SchedulerConfig(n_parallel=1, ctx_per_sequence=512, n_threads=worker_threads(), max_queue=4)
    )
    yield scheduler
    scheduler.close()


@pytest.fixture(scope="module")
def grammar(model: LlamaModel) -> CompiledGrammar:
    return Vocabulary(model.token_table(), model.end_tokens()).compile_json_schema(json.dumps(SCHEMA))


def _prompt(model: LlamaModel, text: str) -> list[int]:
    template = ChatTemplate(
        model.meta("tokenizer.chat_template") or CHATML, bos_token=model.bos_text, eos_token=model.eos_text
    )
    return model.tokenize(template.render([{"role": "user", "content": text}]), add_special=False)


def _generate(
    scheduler: Scheduler,
    text: str,
    sampling: Sampling,
    grammar: CompiledGrammar | None = None,
    max_tokens: int = MAX_TOKENS,
) -> str:
    """One generation at a time: alone in its batch, its output depends on its sampling only."""
    sink = TextSink()
    prompt = _prompt(scheduler.model, text)
    scheduler.submit(
        GenerationRequest(prompt=prompt, max_tokens=max_tokens, sink=sink, sampling=sampling, grammar=grammar)
    )
    assert sink.ended.wait(WAIT_S)
    assert sink.error is None, sink.error
    return "".join(sink.text)


def _valid(text: str) -> dict[str, Any]:
    value = json.loads(text)
    jsonschema.validate(value, SCHEMA)
    return value  # type: ignore[no-any-return]


GREEDY = Sampling(temperature=0.0)


@pytest.fixture(scope="module")
def greedy(scheduler: Scheduler, grammar: CompiledGrammar) -> dict[str, str]:
    """The temperature-0 outputs the tests compare with, generated once."""
    return {
        STORY: _generate(scheduler, STORY, GREEDY),
        LOOP: _generate(scheduler, LOOP, GREEDY),
        SHAPED: _generate(scheduler, SHAPED, GREEDY, grammar, max_tokens=SHAPED_TOKENS),
    }


def test_top_k_1_at_temperature_1_is_greedy(scheduler, greedy):
    for seed in (1, 2):
        assert _generate(scheduler, STORY, Sampling(temperature=1.0, top_k=1, seed=seed)) == greedy[STORY]


def test_min_p_1_at_temperature_1_is_greedy(scheduler, greedy):
    assert _generate(scheduler, STORY, Sampling(temperature=1.0, min_p=1.0, seed=1)) == greedy[STORY]


def test_the_same_seed_gives_the_same_output_and_others_differ(scheduler):
    outputs = [_generate(scheduler, STORY, Sampling(temperature=1.0, seed=seed)) for seed in (7, 7, 8, 9)]
    assert outputs[0] == outputs[1]
    assert len(set(outputs[1:])) == 3


def test_a_small_top_k_narrows_the_output(scheduler):
    """top_k 2 against 0 (off) at temperature 1.5, same seed: a different choice somewhere."""
    wide = _generate(scheduler, STORY, Sampling(temperature=1.5, min_p=0.0, seed=3))
    narrow = _generate(scheduler, STORY, Sampling(temperature=1.5, min_p=0.0, top_k=2, seed=3))
    assert wide != narrow


def test_a_top_k_past_the_vocabulary_keeps_every_token(scheduler):
    """On free text as under a grammar: not cut to llama.cpp's int32 (2**32 + 5 was 5)."""
    wide = _generate(scheduler, STORY, Sampling(temperature=1.5, min_p=0.0, seed=3))
    huge = _generate(scheduler, STORY, Sampling(temperature=1.5, min_p=0.0, top_k=2**32 + 5, seed=3))
    assert huge == wide


def test_the_greedy_answer_repeats_a_word(greedy):
    """The baseline the penalty tests stand on: without penalties, the loop is there."""
    assert greedy[LOOP].count(LOOP_WORD) >= 8


@pytest.mark.parametrize(
    "penalty",
    [
        Sampling(temperature=0.0, repeat_penalty=1.8),
        Sampling(temperature=0.0, frequency_penalty=1.0),
        # Once "1" and "," were both seen, presence lowers both alike: it takes more to break.
        Sampling(temperature=0.0, presence_penalty=1.5),
    ],
    ids=["repeat", "frequency", "presence"],
)
def test_a_penalty_breaks_the_loop(scheduler, greedy, penalty):
    """At temperature 0 (penalties, then greedy, in one llama.cpp chain)."""
    looped = greedy[LOOP].count(LOOP_WORD)
    penalized = _generate(scheduler, LOOP, penalty).count(LOOP_WORD)
    assert penalized < looped / 2, (looped, penalized)


def test_a_penalty_also_acts_at_temperature_1(scheduler, greedy):
    """The same chain with top_k, min_p, temperature and a draw after the penalties."""
    looped = greedy[LOOP].count(LOOP_WORD)
    sampling = Sampling(temperature=1.0, top_k=5, repeat_penalty=1.8, seed=1)
    assert _generate(scheduler, LOOP, sampling).count(LOOP_WORD) < looped / 2


GRAMMAR_CONTROLS = {
    "top_k": Sampling(temperature=1.0, top_k=3, seed=1),
    "top_p": Sampling(temperature=1.0, top_p=0.8, seed=1),
    "min_p": Sampling(temperature=1.0, min_p=0.3, seed=1),
    "repeat_penalty": Sampling(temperature=1.0, repeat_penalty=1.8, seed=1),
    "frequency_penalty": Sampling(temperature=1.0, frequency_penalty=1.0, seed=1),
    "presence_penalty": Sampling(temperature=1.0, presence_penalty=1.0, seed=1),
    "seed": Sampling(temperature=1.0, seed=12345),
    "all": Sampling(temperature=0.8, top_k=20, top_p=0.9, min_p=0.1, repeat_penalty=1.3, presence_penalty=0.5, seed=2),
}


@pytest.mark.parametrize("sampling", GRAMMAR_CONTROLS.values(), ids=GRAMMAR_CONTROLS.keys())
def test_the_grammar_holds_under_each_control(scheduler, grammar, sampling):
    _valid(_generate(scheduler, SHAPED, sampling, grammar, max_tokens=SHAPED_TOKENS))


def test_under_a_grammar_top_k_1_is_greedy_and_a_seed_repeats(scheduler, grammar, greedy):
    _valid(greedy[SHAPED])
    top_1 = Sampling(temperature=1.0, top_k=1, seed=4)
    assert _generate(scheduler, SHAPED, top_1, grammar, max_tokens=SHAPED_TOKENS) == greedy[SHAPED]
    seeded = Sampling(temperature=1.0, seed=4)
    assert _generate(scheduler, SHAPED, seeded, grammar, max_tokens=SHAPED_TOKENS) == _generate(
        scheduler, SHAPED, seeded, grammar, max_tokens=SHAPED_TOKENS
    )


@pytest.mark.parametrize(
    "penalty",
    [
        Sampling(temperature=0.0, repeat_penalty=1.8),
        Sampling(temperature=0.0, frequency_penalty=1.0),
        Sampling(temperature=0.0, presence_penalty=1.0),
    ],
    ids=["repeat", "frequency", "presence"],
)
def test_penalties_apply_under_a_grammar(scheduler, grammar, greedy, penalty):
    """At temperature 0 only the penalties can change the choice: they reach the grammar path."""
    penalized = _generate(scheduler, SHAPED, penalty, grammar, max_tokens=SHAPED_TOKENS)
    _valid(penalized)
    assert penalized != greedy[SHAPED]
