"""Whether a draft position's logits are those of decoding its token alone (issue 39): the
embedded model reads an edit prompt, decodes 60 greedy tokens one a step, then decodes the same
tokens again 9 a step (a last token and 8 drafts, as the scheduler verifies them), with flash
attention on and off. A script, not a benchmark:

    python bench/scripts/draft_logits_probe.py

Measured on the 2-core build machine: on, largest logit difference 0.0 (bit for bit); off, 1.10,
no argmax changed over those 60 positions, the closest top-2 gap 0.006
(docs/operations/concurrency.md#drafts: why `--draft auto` drafts only with it on).
"""

from __future__ import annotations

import ctypes

import numpy as np

from lmsp.engine.chat_template import CHATML, ChatTemplate
from lmsp.engine.llama import Batch, Context, ContextConfig, LlamaModel
from lmsp.engine.registry import embedded_model_path

TEXT = (
    "Repeat the following text exactly, but change the word 'blue' to 'green':\n\n"
    "The old lighthouse stood at the edge of the cliff, its blue door facing the sea. Every evening "
    "the keeper climbed the narrow stairs, lit the lamp, and watched the ships pass slowly in the "
    "dark. In the morning he wrote a few lines in his book about the wind, the waves and the birds."
)
STEPS, WIDTH = 60, 9


def main() -> None:
    model = LlamaModel(embedded_model_path())
    template = ChatTemplate(
        model.meta("tokenizer.chat_template") or CHATML, bos_token=model.bos_text, eos_token=model.eos_text
    )
    prompt = model.tokenize(template.render([{"role": "user", "content": TEXT}]), add_special=False)
    n_vocab = model.n_vocab

    def row(ctx: Context, i: int) -> np.ndarray:
        return np.ctypeslib.as_array((ctypes.c_float * n_vocab).from_address(ctx.logits_address(i))).copy()

    for flash in (True, False):
        ctx = Context(model, ContextConfig(n_ctx=1024, n_seq_max=1, n_batch=512, n_threads=2, flash_attn=flash))
        batch = Batch(512)
        for i, token in enumerate(prompt):
            batch.add(token, i, 0, i == len(prompt) - 1)
        assert ctx.decode(batch) == 0
        index, tokens, alone = batch.n - 1, [], []
        for step in range(STEPS):
            alone.append(row(ctx, index))
            tokens.append(int(alone[-1].argmax()))
            batch.clear()
            index = batch.add(tokens[-1], len(prompt) + step, 0, True)
            assert ctx.decode(batch) == 0
        ctx.forget(0, len(prompt))
        worst, flips, start = 0.0, 0, 0
        while start < STEPS - 1:
            batch.clear()
            n = min(WIDTH, STEPS - 1 - start)
            for i in range(n):
                batch.add(tokens[start + i], len(prompt) + start + i, 0, True)
            assert ctx.decode(batch) == 0
            for i in range(n):
                ours, theirs = row(ctx, i), alone[start + i + 1]
                worst = max(worst, float(np.abs(ours - theirs).max()))
                flips += int(ours.argmax()) != int(theirs.argmax())
            start += n
        gap = min(float(np.diff(np.sort(r)[-2:])[0]) for r in alone)
        print(
            f"flash attention {'on' if flash else 'off'}: largest |logit difference| {worst:.4g}, "
            f"argmax changed at {flips} of {STEPS - 1} positions, closest top-2 gap {gap:.4g}"
        )
        batch.close()
        ctx.close()
    model.close()


if __name__ == "__main__":
    main()
