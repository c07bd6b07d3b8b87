"""Stop sequences: the output ends before the first of them, and none of it is ever sent.

Text that could be the start of a stop sequence is held back until the next piece shows it
is not (then it goes out) or is (then the output ends there).
"""

from __future__ import annotations

__all__ = ["StopMatcher"]


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text that may go out now, whether a stop sequence was reached)."""
        held = self._held + text
        found = [i for i in (held.find(s) for s in self._stops) if i >= 0]
        if found:
            self._held = ""
            return held[: min(found)], True
        keep = max((_prefix_at_end(held, s) for s in self._stops), default=0)
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep], False

    def flush(self) -> str:
        """At the end of the output: what was held back was text after all."""
        held, self._held = self._held, ""
        return held


def _prefix_at_end(text: str, stop: str) -> int:
    """Length of the longest end of `text` that begins `stop`."""
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
