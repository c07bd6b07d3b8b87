"""What one llama_decode costs on this machine for the batch shapes the scheduler makes, on the
embedded model with 8 sequences of per-sequence caches (as `lmsp serve --parallel 8`): the
facts behind the scheduler's batch layout and its prompt copies. A script, not a benchmark:

    python bench/scripts/engine_probe.py

Each figure is the median of 5 decodes, in ms. What to look for (2-core CI machine): 8
generating tokens in slot order cost about 33 ms and shuffled about 53, because llama.cpp
splits a batch for per-sequence caches into blocks of consecutive sequence ids; 8 prompts of
unequal lengths cost up to 12 % more than 8 of equal lengths with the same total; copying one
sequence's cache to another costs about what decoding 7 prompt tokens does.
"""

from __future__ import annotations

import statistics
import time

from lmsp.engine.llama import Batch, Context, ContextConfig, LlamaModel
from lmsp.engine.registry import embedded_model_path
from lmsp.engine.scheduler import SchedulerConfig

SLOTS, WINDOW, HISTORY = 8, 4096, 24


def main() -> None:
    model = LlamaModel(embedded_model_path())  # type: ignore[arg-type]
    ctx = Context(
        model, ContextConfig(n_ctx=WINDOW * SLOTS, n_seq_max=SLOTS, n_batch=512, n_threads=SchedulerConfig().n_threads)
    )
    batch = Batch(512)

    def token(seq: int, pos: int) -> int:
        return 100 + (pos * 7 + seq * 13) % 1000

    def decode(entries: list[tuple[int, int]], copy: bool = False) -> float:
        """Median ms of decoding `entries` ((sequence, tokens) in batch order) after every
        sequence read HISTORY tokens; `copy`: sequence 0's cache is first copied to 1."""
        times = []
        for _ in range(5):
            batch.clear()
            for seq in range(SLOTS):
                ctx.forget(seq)
                for pos in range(HISTORY):
                    batch.add(token(seq, pos), pos, seq, pos == HISTORY - 1)
            assert ctx.decode(batch) == 0
            if copy:
                ctx.copy(0, 1)
            batch.clear()
            for seq, n in entries:
                for i in range(n):
                    batch.add(token(seq, HISTORY + i), HISTORY + i, seq, i == n - 1)
            started = time.perf_counter()
            assert ctx.decode(batch) == 0
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e3

    generating = [(s, 1) for s in range(SLOTS)]
    shuffled = [(s, 1) for s in (3, 0, 5, 1, 7, 2, 6, 4)]
    unequal = list(zip(range(SLOTS), (17, 19, 21, 23, 25, 27, 29, 31), strict=True))
    print(f"1 generating token:                    {decode([(0, 1)]):7.1f} ms")
    print(f"8 generating tokens, in slot order:    {decode(generating):7.1f} ms")
    print(f"8 generating tokens, shuffled:         {decode(shuffled):7.1f} ms")
    print(f"8 prompts of 24 tokens:                {decode([(s, 24) for s in range(SLOTS)]):7.1f} ms")
    print(f"8 prompts of 17 to 31 tokens (192):    {decode(unequal):7.1f} ms")
    print(f"one prompt of 192 tokens:              {decode([(0, 192)]):7.1f} ms")
    print(
        f"1 generating token after a cache copy: {decode([(0, 1)], copy=True):7.1f} ms"
        " (the copy is made in this decode)"
    )
    batch.close()
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
