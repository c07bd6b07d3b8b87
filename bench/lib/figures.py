"""What the suites and the scripts share about figures: the workload size, the figures the run
collects and how a missing or repeated one is written."""

from __future__ import annotations

import os
import statistics
from typing import Any

QUICK = os.environ.get("LMSP_BENCH_QUICK") == "1"
SCRIPTED = "scripted:bench"
# Every bench server keeps its model loaded: no timed figure may include a reload after the
# default 5 idle minutes (the llama-server build alone takes longer on a fresh machine).
KEEP_LOADED = ("--keep-alive", "-1")
FIGURES: dict[str, Any] = {}
NOT_MEASURED = "not measured"
NOISE = "noise."


def repeated(figures: dict[str, Any], name: str, samples: list[float]) -> None:
    """A figure measured several times in the run: their median, and beside it, as
    `noise.NAME`, their spread relative to it ((max - min) / median), the noise the report
    (bench/scripts/report.py) weighs a move from the previous run against."""
    middle = statistics.median(samples)
    figures[name] = middle
    if len(samples) > 1 and middle:
        figures[f"{NOISE}{name}"] = (max(samples) - min(samples)) / abs(middle)


def round_order(sides: tuple[str, ...], i: int) -> tuple[str, ...]:
    """Round i's order of the sides measured in one run: rotated round by round, so that drift
    in the machine, and whatever going first in a round does, hits every side alike (two sides
    alternate)."""
    k = i % len(sides)
    return sides[k:] + sides[:k]


def on_off_rates(
    figures: dict[str, Any],
    suite: str,
    what: str,
    rates: dict[str, list[float]],
    ratio: str = "on_off_events_s_ratio",
) -> None:
    """Events/s of a feature turned on and off, measured in alternating rounds of one run: the
    best of each side, their ratio (`SUITE.RATIO`) and the ratio round by round."""
    best = {side: max(r) for side, r in rates.items()}
    figures[f"{suite}.{what}.on_events_per_s"] = best["on"]
    figures[f"{suite}.{what}.off_events_per_s"] = best["off"]
    figures[f"{suite}.{ratio}"] = best["on"] / best["off"]
    ratios = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    repeated(figures, f"{suite}.{what}.round_ratio", ratios)


def not_measured(reason: str) -> str:
    """The value of a figure a benchmark could not measure, with why (never a silent gap)."""
    return f"{NOT_MEASURED} ({reason[:300]})"
