"""Grammar fast-forward: where a grammar allows only one text next (a key's quote and colon, the
tail of an enum value), the constraint commits those tokens right after the sampled one, and the
scheduler decodes them together with it as one run of positions in the next step, logits on the
last only: k forced tokens cost that one step instead of k (`serve --fast-forward`).

Forced tokens go out at once through the same per-token path as sampled ones (detokenizer, stop
sequences, sink, counts), so a client sees them as it would have, only sooner. The text is the
trie's longest-match tokenization of the forced bytes (`Vocabulary(fast_forward=True)`), not
necessarily the model's own: what the model writes after a forced run may differ, still valid
under the grammar (docs/guides/structured-output.md).
"""

from __future__ import annotations

__all__ = ["forced_room"]


def forced_room(*, n_out: int, max_tokens: int | None, cached: int, window: int, share: int) -> int:
    """How many forced tokens may follow a token just sampled: within the output budget (no
    token is committed that could not be sent), the sequence's context window (`cached`
    tokens decoded, the sampled one next), and its `share` of a step's batch (the run and the
    sampled token are decoded in one step, beside every other sequence's tokens)."""
    room = min(window - cached - 1, share - 1)
    if max_tokens is not None:
        room = min(room, max_tokens - n_out)
    return max(0, room)
