"""Prompt-lookup drafts: the next tokens guessed from what the sequence already holds.

An edit, a rewritten document or JSON sent back with one field changed repeats long runs of
its prompt. After each accepted token, the last `n` tokens (from `max_n` down to `min_n`)
are looked up in everything before them, prompt and output alike; the tokens that followed
their most recent earlier occurrence are the draft. The scheduler decodes the draft beside
the sequence's next token in one step and keeps the prefix the model agrees with (greedy
only: scheduler.py), so a good guess saves steps and a bad one costs a few wasted positions.

The lookup is a dict per n-gram length, from the n tokens to where they last ended, kept up
to date as tokens come: one draft costs `max_n` dict reads, whatever the history's length.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DEFAULT_DRAFT_MAX", "NgramDrafter"]

# Tokens one draft proposes at most (`serve --draft-max`): an edit copies runs of tens of
# tokens, and a rejected position costs little beside the step's pass over the weights.
DEFAULT_DRAFT_MAX = 8


class NgramDrafter:
    """Drafts for one sequence: `extend` it with every token the sequence keeps, in order
    (its prompt, then each accepted output token), and ask `draft` after each."""

    __slots__ = ("_index", "_tokens", "max_n", "min_n")

    def __init__(self, tokens: Iterable[int] = (), *, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram lengths {min_n}..{max_n}")
        self.max_n, self.min_n = max_n, min_n
        self._tokens: list[int] = []
        # _index[n - 1]: n tokens -> the index of the last of them at their latest occurrence
        # that is not the history's end (an n-gram enters once a token follows it, so a
        # lookup of the last n tokens never finds themselves).
        self._index: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n)]
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        history = self._tokens
        index = self._index
        for token in tokens:
            end = len(history) - 1  # the n-grams ending here now have a follower
            for n in range(1, min(self.max_n, end + 1) + 1):
                index[n - 1][tuple(history[end - n + 1 : end + 1])] = end
            history.append(token)

    def draft(self, k: int) -> list[int]:
        """Up to `k` tokens that followed the longest (then most recent) earlier occurrence
        of the history's last n tokens; [] when none of them occurred before."""
        history = self._tokens
        if k <= 0:
            return []
        size = len(history)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            end = self._index[n - 1].get(tuple(history[size - n :]))
            if end is not None:
                return history[end + 1 : end + 1 + k]
        return []
