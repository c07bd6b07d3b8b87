"""Stop sequences: the output ends before the first of them, and none of it is ever sent.

Text that could be the start of a stop sequence is held back until the next piece shows it
is not (then it goes out) or is (then the output ends there).

All the stops are looked for in one pass (an Aho-Corasick automaton, built once per
request): a token's text costs a few steps per character whatever the number and length of
the stops (issue 38: a loop over every stop on every token, on the model's thread, cost ~90 ms
a token with 100k stops, and one stop of 256 `a`s against an output of `a`s rescanned the
whole held text for every stop on every token).
"""

from __future__ import annotations

__all__ = ["StopMatcher"]


class _Automaton:
    """The stops' trie with failure links. A state is a string that begins some stop (the root:
    ""); `depth[s]` is its length, `longest[s]` the length of the longest stop that ends it
    (0: none)."""

    __slots__ = ("depth", "fail", "goto", "longest", "widest")

    def __init__(self, stops: tuple[str, ...]) -> None:
        goto: list[dict[str, int]] = [{}]
        depth = [0]
        ends = [False]
        for stop in stops:
            state = 0
            for ch in stop:
                nxt = goto[state].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[state][ch] = nxt
                    goto.append({})
                    depth.append(depth[state] + 1)
                    ends.append(False)
                state = nxt
            ends[state] = True
        # Breadth first: a state's failure (the longest proper end of it that is a state) is
        # shallower, so it is complete when the state is reached.
        fail = [0] * len(goto)
        longest = [0] * len(goto)
        order = list(goto[0].values())
        for state in order:
            longest[state] = depth[state] if ends[state] else longest[fail[state]]
            for ch, child in goto[state].items():
                f = fail[state]
                while f and ch not in goto[f]:
                    f = fail[f]
                fail[child] = goto[f].get(ch, 0)  # shallower than child: never itself
                order.append(child)
        self.goto, self.depth, self.fail, self.longest = goto, depth, fail, longest
        self.widest = max(map(len, stops), default=0)


class StopMatcher:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self._dfa = _Automaton(tuple(s for s in stops if s))
        # The held text is the state's string: the longest end of the output so far that
        # begins a stop (and is none: a whole stop ends the output).
        self._state = 0
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text that may go out now, whether a stop sequence was reached)."""
        dfa = self._dfa
        goto, fail, longest = dfa.goto, dfa.fail, dfa.longest
        state = self._state
        base = len(self._held)
        cut = -1  # where the earliest-starting stop found so far starts, in held + text
        for i, ch in enumerate(text):
            if cut >= 0 and base + i + 1 - dfa.widest >= cut:
                break  # no stop ending here or later can start before the one found
            nxt = goto[state].get(ch)
            while nxt is None and state:
                state = fail[state]
                nxt = goto[state].get(ch)
            state = nxt or 0
            n = longest[state]  # of the stops ending here, the longest starts first
            if n:
                start = base + i + 1 - n
                if cut < 0 or start < cut:
                    cut = start
        held = self._held + text
        if cut >= 0:
            self._state, self._held = 0, ""
            return held[:cut], True
        keep = dfa.depth[state]
        self._state = state
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep], False

    def flush(self) -> str:
        """At the end of the output: what was held back was text after all."""
        held, self._held, self._state = self._held, "", 0
        return held
