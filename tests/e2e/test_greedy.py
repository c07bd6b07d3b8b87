"""Temperature 0 without llama.cpp's sampler: the scheduler takes the argmax of the logits row
in place (`_core._greedy_at`). It must pick what llama.cpp's greedy sampler picks on the real
model's rows (the lowest id among equals), and refuse an address that cannot be a row."""

from __future__ import annotations

import array
from collections.abc import Iterator

import llama_cpp as ll
import pytest

from lmsp._core import _greedy_at
from lmsp.engine.llama import Batch, Context, ContextConfig, LlamaModel
from lmsp.engine.registry import embedded_model_path


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaModel]:
    model = LlamaModel(embedded_model_path())
    yield model
    model.close()


def _row(values: list[float]) -> tuple[array.array, int]:
    row = array.array("f", values)
    return row, row.buffer_info()[0]


def test_the_same_token_as_llama_cpps_greedy_sampler_on_real_rows(model):
    ctx = Context(model, ContextConfig(n_ctx=512, n_seq_max=1, n_batch=64, n_threads=2))
    batch = Batch(64)
    greedy = ll.llama_sampler_init_greedy()
    try:
        prompt = model.tokenize("The capital of France is", add_special=True)
        for i, token in enumerate(prompt):
            batch.add(token, i, 0, i == len(prompt) - 1)
        assert ctx.decode(batch) == 0
        index, pos, picked = batch.n - 1, len(prompt), []
        for _ in range(40):
            ours = _greedy_at(ctx.logits_address(index), model.n_vocab)
            theirs = ll.llama_sampler_sample(greedy, ctx.handle, index)
            assert ours == theirs
            picked.append(ours)
            batch.clear()
            index = batch.add(ours, pos, 0, True)
            pos += 1
            assert ctx.decode(batch) == 0
        assert len(set(picked)) > 5  # a real continuation, not one token over and over
    finally:
        ll.llama_sampler_free(greedy)
        batch.close()
        ctx.close()


def test_ties_go_to_the_lowest_id_and_nan_never_wins():
    row, address = _row([0.5, 2.0, -1.0, 2.0, 1.0])
    assert _greedy_at(address, len(row)) == 1
    row, address = _row([float("nan"), 0.1, float("nan"), 0.3])
    assert _greedy_at(address, len(row)) == 3
    row, address = _row([float("-inf"), float("-inf")])
    assert _greedy_at(address, len(row)) == 0


@pytest.mark.parametrize("address, n", [(0, 4), (3, 4), (None, 0)])
def test_an_address_that_cannot_be_a_row_is_refused(address, n):
    row, start = _row([1.0, 2.0, 3.0, 4.0])
    with pytest.raises(ValueError, match="logits"):
        _greedy_at(start if address is None else address, n)
