"""How one generation picks its tokens: the controls a face may set, with llama.cpp's meaning.

Free text is sampled by a llama.cpp sampler chain built from these values; output under a
grammar by lmsp-constrain's sampler, given the same values (engine/scheduler.py). A value at its
default leaves its stage out of the chain.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MIN_P", "DEFAULT_TEMPERATURE", "PENALTY_LAST_N", "Sampling"]

# The draft leaves the default open; 1.0 samples the model as trained (as the Responses API does).
DEFAULT_TEMPERATURE = 1.0
# Tokens less likely than this share of the best one are never sampled (llama-server's default
# too), the same for free text and grammars: it keeps a small model at temperature 1 out of the
# long tail of its vocabulary.
DEFAULT_MIN_P = 0.05
# How many of the latest tokens the penalties look at (llama-server's `repeat_last_n` default): of
# the generation's own output, not its prompt (Scheduler._make_sampler says why).
PENALTY_LAST_N = 64


@dataclass(frozen=True)
class Sampling:
    temperature: float = DEFAULT_TEMPERATURE  # 0: greedy
    top_p: float = 1.0  # 1: off
    top_k: int = 0  # 0: off
    min_p: float = DEFAULT_MIN_P  # 0: off
    repeat_penalty: float = 1.0  # 1: off; divides a positive logit of a recent token
    presence_penalty: float = 0.0  # subtracted once from a token seen lately
    frequency_penalty: float = 0.0  # subtracted per time a token was seen lately
    seed: int = -1  # -1: a fresh random seed per generation

    @property
    def penalized(self) -> bool:
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def greedy(self) -> bool:
        """Every token is the likeliest one (under a grammar, the likeliest it allows)."""
        return self.temperature <= 0.0 and not self.penalized
