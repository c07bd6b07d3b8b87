"""What the stop matcher (engine/stops.py) costs per token on the model's thread: one stop of
256 characters against 16 of them (the most `--max-stops` and `--max-stop-chars` allow), for
the automaton and for the plain matcher it replaced (one `find` per stop, and a scan of the
held text per stop, on every token). A script, not a benchmark:

    python bench/scripts/stop_probe.py

Two outputs: prose that never begins a stop (the usual case), and `a`s against stops of 255
`a`s and one more letter (every token extends a held prefix: the plain matcher's worst case).
Each figure is the median of 7 runs of 2,000 tokens, in µs per token. And what building the
automaton costs, once per request at admission (on the model's thread, as the plain matcher's
nothing did): 16 stops of 256 random letters (4,096 states, the most the limits allow) and two
short ones, median of 7, in µs.
"""

from __future__ import annotations

import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from lmsp.engine.stops import StopMatcher

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))  # bench/lib: shared with the suites
from naive_stops import NaiveMatcher

TOKENS, RUNS = 2000, 7
PROSE = ["The", " river", " runs", " to", " the", " sea", ",", " and", " then", " back", "."] * 200
SAME = ["aaaa"] * TOKENS


def per_token_us(make: Callable[[tuple[str, ...]], Any], stops: tuple[str, ...], pieces: list[str]) -> float:
    runs = []
    for _ in range(RUNS):
        matcher = make(stops)
        feed = matcher.feed
        started = time.perf_counter()
        for piece in pieces[:TOKENS]:
            feed(piece)
        runs.append((time.perf_counter() - started) / TOKENS * 1e6)
    return statistics.median(runs)


def main() -> None:
    cases = {
        "prose": (PROSE, tuple(f"<|stop {i}|>" + "x" * 244 for i in range(16))),
        "a's": (SAME, tuple("a" * 255 + chr(ord("A") + i) for i in range(16))),
    }
    print(f"{'output':6} {'matcher':10} {'1 stop':>9} {'16 stops':>9}  (µs per token, 256-char stops)")
    for name, (pieces, stops) in cases.items():
        for label, make in (("automaton", StopMatcher), ("plain", NaiveMatcher)):
            one = per_token_us(make, stops[:1], pieces)
            many = per_token_us(make, stops, pieces)
            print(f"{name:6} {label:10} {one:9.2f} {many:9.2f}")
    rng = random.Random(38)
    widest = tuple("".join(rng.choice(string.ascii_letters) for _ in range(256)) for _ in range(16))
    for label, stops in (("16 x 256 chars", widest), ("2 short", ("</s>", "\n\nUser:"))):
        builds = []
        for _ in range(RUNS):
            started = time.perf_counter()
            StopMatcher(stops)
            builds.append((time.perf_counter() - started) * 1e6)
        print(f"build, {label}: {statistics.median(builds):.0f} µs")


if __name__ == "__main__":
    main()
