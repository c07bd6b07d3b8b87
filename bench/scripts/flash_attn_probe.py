"""What llama.cpp's flash attention costs a decode step on this machine, by context length: the
embedded model, 8 sequences (`--sequences`) of per-sequence caches (as `lmsp serve --parallel
8`), each with CONTEXT tokens of past, decoding one token each; on (lmsp's default on a CPU, and
llama.cpp's own choice) against off, in alternating rounds. A script, not a benchmark:

    python bench/scripts/flash_attn_probe.py [--threads N] [--sequences N] [CONTEXT ...]

Each figure is one round's mean of 15 steps, in ms. Measured on the 2-core build machine with
upstream's kernel, on against off: 50 tokens 50-82 against 55-94, 150 tokens 64-80 against
54-64, 300 tokens 105-116 against 72-91, 700 tokens 194-243 against 99-125; with our wheels'
patched kernel, idle, 50 tokens 29-33 against 37-39, 700 tokens 51-52 against 62-63
(docs/operations/concurrency.md#flash-attention).
`--threads 1` (2 is lmsp's on that machine) keeps OpenMP's spinning out of figures taken on a
shared machine; docs/operations/builds.md#our-patches-to-llamacpp has such figures.
`--sequences 1` times a lone sequence's step; `LLAMA_CPP_LIB_PATH=DIR` runs another build's
libraries (that is how the patch was compared with upstream's kernel).
"""

from __future__ import annotations

import argparse
import time

from lmsp.engine.llama import Batch, Context, ContextConfig, LlamaModel
from lmsp.engine.registry import embedded_model_path

STEPS, ROUNDS = 15, 3
SETTINGS = {"on": True, "off": False}


def fill(ctx: Context, context: int, sequences: int) -> None:
    batch = Batch(512)
    for seq in range(sequences):
        ctx.forget(seq, 0)
        for start in range(0, context, 256):
            batch.clear()
            for pos in range(start, min(context, start + 256)):
                batch.add(100 + (pos * 7 + seq) % 1000, pos, seq, False)
            assert ctx.decode(batch) == 0


def steps(ctx: Context, context: int, sequences: int) -> float:
    """Mean ms of STEPS steps of one token per sequence; the cells they added are dropped."""
    batch = Batch(512)
    started = time.perf_counter()
    for k in range(STEPS):
        batch.clear()
        for seq in range(sequences):
            batch.add(200 + k, context + k, seq, True)
        assert ctx.decode(batch) == 0
    ms = (time.perf_counter() - started) / STEPS * 1000
    for seq in range(sequences):
        ctx.forget(seq, context)
    return ms


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sequences", type=int, default=8)
    parser.add_argument("contexts", type=int, nargs="*", default=[50, 300, 700])
    args = parser.parse_args()
    contexts = args.contexts
    model = LlamaModel(embedded_model_path())
    n = args.sequences
    config = {"n_ctx": 4096 * n, "n_seq_max": n, "n_batch": 512, "n_threads": args.threads}
    contexts_by = {name: Context(model, ContextConfig(**config, flash_attn=fa)) for name, fa in SETTINGS.items()}
    for context in contexts:
        for ctx in contexts_by.values():
            fill(ctx, context, n)
        times: dict[str, list[float]] = {name: [] for name in SETTINGS}
        for _ in range(ROUNDS):
            for name, ctx in contexts_by.items():
                times[name].append(steps(ctx, context, n))
        shown = "; ".join(f"{name} {', '.join(f'{t:.0f}' for t in ts)}" for name, ts in times.items())
        print(f"{context} tokens of context: {shown} ms a step", flush=True)


if __name__ == "__main__":
    main()
