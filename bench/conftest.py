"""Benchmarks: pytest-benchmark timings plus the figures that matter as ratios against a
baseline measured in the same run. `LMSP_BENCH_QUICK=1` shrinks every workload (CI)."""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.testing import RunningServer, start_server

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
    (bench/report.py) weighs a move from the previous run against."""
    middle = statistics.median(samples)
    figures[name] = middle
    if len(samples) > 1 and middle:
        figures[f"{NOISE}{name}"] = (max(samples) - min(samples)) / abs(middle)


def not_measured(reason: str) -> str:
    """The value of a figure a benchmark could not measure, with why (never a silent gap)."""
    return f"{NOT_MEASURED} ({reason[:300]})"


@pytest.fixture(scope="session")
def figures() -> dict[str, Any]:
    return FIGURES


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # The scripted stream bench asks for up to 500,000 events in one response.
    srv = start_server(
        tmp_path_factory.mktemp("bench"), "--scripted-model", SCRIPTED, "--max-output-tokens", "1000000", *KEEP_LOADED
    )
    yield srv
    srv.stop()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not FIGURES:
        return
    terminalreporter.section("lmsp figures")
    for name, value in sorted(FIGURES.items()):
        if name.startswith(NOISE):  # in figures.json, for the report; too many to read here
            continue
        shown = f"{value:,.3f}" if isinstance(value, float) else str(value)
        terminalreporter.write_line(f"{name:<48} {shown}")
    missing = {name: value for name, value in FIGURES.items() if str(value).startswith(NOT_MEASURED)}
    if missing:
        terminalreporter.section("NOT MEASURED", red=True, bold=True)
        for name, value in sorted(missing.items()):
            terminalreporter.write_line(f"{name}: {value}", red=True)
    out = Path(os.environ.get("LMSP_BENCH_FIGURES", "bench/results/figures.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(FIGURES, indent=2, sort_keys=True) + "\n")
    terminalreporter.write_line(f"figures written to {out}")
