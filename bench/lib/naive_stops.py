"""The stop matcher before issue 38 (every stop looked for in the held text on every
token): the reference the Aho-Corasick matcher is compared with, in tests and in the probe."""

from __future__ import annotations


class NaiveMatcher:
    """Every stop looked for in the held text on every token."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        held = self._held + text
        found = [i for i in (held.find(s) for s in self._stops) if i >= 0]
        if found:
            self._held = ""
            return held[: min(found)], True
        keep = max((_prefix_at_end(held, s) for s in self._stops), default=0)
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep], False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held


def _prefix_at_end(text: str, stop: str) -> int:
    for n in range(min(len(text), len(stop) - 1), 0, -1):
        if stop.startswith(text[-n:]):
            return n
    return 0
