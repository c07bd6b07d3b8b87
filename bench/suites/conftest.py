"""Benchmarks: pytest-benchmark timings plus the figures that matter as ratios against a
baseline measured in the same run. `LMSP_BENCH_QUICK=1` shrinks every workload (CI).

The suites' own modules (figures, model streams, llama-server, process stats, SSE client) are in
bench/lib/ (on the path: pyproject.toml's `pythonpath`), shared with the scripts in bench/scripts/;
bench imports nothing from tests/."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from figures import FIGURES, KEEP_LOADED, NOISE, NOT_MEASURED, SCRIPTED
from lmsp.testing import RunningServer, start_server


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
