"""Prompt-lookup drafts: the next tokens guessed from what the sequence already holds.

An edit, a rewritten document or JSON sent back with one field changed repeats long runs of
its prompt. After each accepted token, the last `n` tokens (from `max_n` down to `min_n`, 3 to 2)
are looked up in everything before them, prompt and output alike; the tokens that followed
their most recent earlier occurrence are the draft. The scheduler decodes the draft beside
the sequence's next token in one step and keeps the prefix the model agrees with (greedy
only: scheduler.py), so a good guess saves steps and a bad one costs the positions it took.

A draft is as long as half the context that matched (how far the earlier occurrence agrees
with the history's end, counted back from the lookup), at most `k`: a draft position is not
free on a CPU (each is a row of logits; on the embedded model and 2 cores, a step of 1 + 8
tokens took 3 to 6 times a lone token's), and a long match is where a copy goes on. Inside a
copied run the match grows with every accepted token, so drafts lengthen by themselves; where
the text merely reuses a word or two, it proposes one token or none. Replayed over the
recorded T=0 tokens of tests/e2e/test_drafts.py's prompts and bench_drafts.py's edits, with
those step costs, always drafting `k` after any match made free text 0.5-0.75x as fast as no
drafts (12% of draft tokens accepted); half the match made it 1.0-1.1x, and the edits
1.2-1.7x where llama-server's n-gram drafts (a 3-token match, 8 after it) gave 1.05-1.55x.

The lookup is a dict per n-gram length, from the n tokens to where they last ended, kept up
to date as tokens come: one draft costs `max_n` dict reads and at most 2k token comparisons,
whatever the history's length.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["DEFAULT_DRAFT_MAX", "NgramDrafter"]

# Tokens one draft proposes at most (`serve --draft-max`): an edit copies runs of tens of
# tokens, and a draft is this long only where twice as many tokens matched.
DEFAULT_DRAFT_MAX = 8


class NgramDrafter:
    """Drafts for one sequence: `extend` it with every token the sequence keeps, in order
    (its prompt, then each accepted output token), and ask `draft` after each."""

    __slots__ = ("_index", "_tokens", "max_n", "min_n")

    def __init__(self, tokens: Iterable[int] = (), *, max_n: int = 3, min_n: int = 2) -> None:
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
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                index[n - 1][tuple(history[end - n + 1 : end + 1])] = end
            history.append(token)

    def draft(self, k: int) -> list[int]:
        """The tokens that followed the longest (then most recent) earlier occurrence of the
        history's last n tokens, half as many as the tokens that match there (the n, and as
        many before them as agree), at most `k`; [] when none of them occurred before."""
        history = self._tokens
        if k <= 0:
            return []
        size = len(history)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            end = self._index[n - 1].get(tuple(history[size - n :]))
            if end is None:
                continue
            matched = n
            while matched < 2 * k and matched <= end and history[end - matched] == history[size - 1 - matched]:
                matched += 1
            return history[end + 1 : end + 1 + min(k, matched // 2)]
        return []
