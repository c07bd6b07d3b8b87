"""How one generation picks its tokens: the controls a face may set, with llama.cpp's meaning.

Free text is sampled by a llama.cpp sampler chain built from these values; output under a
grammar by lmsp-constrain's sampler, given the same values (engine/scheduler.py).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MIN_P", "DEFAULT_TEMPERATURE", "Sampling"]

# The draft leaves the default open; 1.0 samples the model as trained (as the Responses API does).
DEFAULT_TEMPERATURE = 1.0
# Tokens less likely than this share of the best one are never sampled (llama-server's default
# too), the same for free text and grammars: it keeps a small model at temperature 1 out of the
# long tail of its vocabulary.
DEFAULT_MIN_P = 0.05


@dataclass(frozen=True)
class Sampling:
    temperature: float = DEFAULT_TEMPERATURE  # 0: greedy
    top_p: float = 1.0  # 1: off; free text only
    min_p: float = DEFAULT_MIN_P  # 0: off
    seed: int = -1  # -1: a fresh random seed per generation
