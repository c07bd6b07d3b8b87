"""Temperature 0 without llama.cpp's sampler: the scheduler takes the argmax of the logits row
in place (`_core._greedy_at`). It must pick what llama.cpp's greedy sampler picks on the real
model's rows (the lowest id among equals). Rows made by hand (ties, NaN, addresses that cannot
be a row): tests/unit/core/test_greedy_at.py."""

from __future__ import annotations

import llama_cpp as ll

from lmsp._core import _greedy_at
from lmsp.engine.llama import Batch, Context, ContextConfig
from lmsp.testing import worker_threads


def test_the_same_token_as_llama_cpps_greedy_sampler_on_real_rows(model):
    ctx = Context(model, ContextConfig(n_ctx=512, n_seq_max=1, n_batch=64, n_threads=worker_threads()))
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
