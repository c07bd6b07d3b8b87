"""An output cut inside a multi-byte character (by max_output_tokens or a stop sequence) ends
before that character: its first bytes are dropped, never sent as U+FFFD. Driven straight
through the scheduler on the real model, under a grammar that makes it write emoji, whose
four bytes the model's tokens split."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from helpers import TextSink
from lmsp._core import CompiledGrammar, Vocabulary
from lmsp.engine.llama import LlamaModel
from lmsp.engine.sampling import Sampling
from lmsp.engine.scheduler import Scheduler, SchedulerConfig
from lmsp.engine.sequence import GenerationRequest
from lmsp.testing import worker_threads

EMOJI = "🎉🌍🚀"
WAIT_S = 120


@pytest.fixture(scope="module")
def scheduler(model: LlamaModel) -> Iterator[Scheduler]:
    scheduler = Scheduler(
        model, SchedulerConfig(n_parallel=1, ctx_per_sequence=256, n_threads=worker_threads(), max_queue=4)
    )
    yield scheduler
    scheduler.close()


@pytest.fixture(scope="module")
def emoji(model: LlamaModel) -> CompiledGrammar:
    return Vocabulary(model.token_table(), model.end_tokens()).compile_lark(f'start: "{EMOJI}"')


def _generate(scheduler: Scheduler, grammar: CompiledGrammar, max_tokens: int, stop: tuple[str, ...] = ()) -> str:
    sink = TextSink()
    prompt = scheduler.model.tokenize("Party emoji:", add_special=False)
    request = GenerationRequest(
        prompt=prompt, max_tokens=max_tokens, sink=sink, sampling=Sampling(temperature=0.0), grammar=grammar, stop=stop
    )
    scheduler.submit(request)
    assert sink.ended.wait(WAIT_S)
    assert sink.error is None, sink.error
    return "".join(sink.text)


def test_a_token_limit_inside_a_character_drops_its_bytes(scheduler, emoji):  # covers: R6.2-4
    whole = _generate(scheduler, emoji, 64)
    assert whole == EMOJI
    cuts = [_generate(scheduler, emoji, n) for n in range(1, 13)]
    assert all("\ufffd" not in cut and EMOJI.startswith(cut) for cut in cuts), cuts
    # The cuts did land inside characters: some limit gave fewer characters than tokens.
    assert any(len(cut) < n for n, cut in enumerate(cuts, 1)), cuts


def test_a_stop_after_a_cut_character_drops_its_bytes_too(scheduler, emoji):  # covers: R6.2-4
    # "x" never comes: the stop matcher holds nothing, and the limit cuts as above.
    cuts = [_generate(scheduler, emoji, n, stop=("x", "🚀")) for n in range(1, 13)]
    assert all("\ufffd" not in cut and EMOJI.startswith(cut) for cut in cuts), cuts
    assert "🌍" in cuts[-1] and "🚀" not in cuts[-1]
