"""Grammar fast-forward (issue 39): schema-constrained Chat Completions answers at temperature 0,
wall time per response, lmsp with `--fast-forward on` ÷ `--fast-forward off` (target ≤ 0.85),
both servers started in this run and their requests interleaved (each schema on one, then the
other, the order rotating), one request at a time, so that a slow minute of a shared machine
falls on both sides alike.

Figures: `fast_forward.on_off_wall_ratio` (the median over schemas of the ratio of each side's
best time, and `round_wall_ratio`, each round's total time), ms per response on each side, how many
answers were valid, cut by the token budget or differed between the sides, and from each server's
`/metrics`: the share of output tokens forced and the mean tokens a decode step took.
Quick mode (LMSP_BENCH_QUICK=1): 8 schemas, one round, a 96-token budget.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
from prometheus_client.parser import text_string_to_metric_families

from figures import KEEP_LOADED, QUICK, repeated, round_order
from lmsp.testing import RunningServer, start_server

MODEL = "smollm2:135m-instruct-q4_1"
CORPUS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[2] / "tests" / "fixtures" / "corpus" / "json_schemas.json").read_text()
)
SAMPLE = CORPUS[:8] if QUICK else CORPUS
ROUNDS = 1 if QUICK else 3
MAX_TOKENS = 96 if QUICK else 384
SIDES = ("on", "off")
COUNTERS = ("lmsp_forced_tokens_total", "lmsp_output_tokens_total", "lmsp_engine_steps_total")


def _ask(client: httpx.Client, url: str, case: dict[str, Any]) -> tuple[float, str, str]:
    payload = {
        "model": MODEL,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": case["prompt"]}],
        "response_format": {"type": "json_schema", "json_schema": {"name": case["name"], "schema": case["schema"]}},
    }
    started = time.perf_counter()
    r = client.post(f"{url}/v1/chat/completions", json=payload)
    elapsed = time.perf_counter() - started
    r.raise_for_status()
    choice = r.json()["choices"][0]
    return elapsed, choice["message"]["content"], choice["finish_reason"]


def _outcome(case: dict[str, Any], text: str, finish: str) -> str:
    if finish == "length":
        return "cut"
    try:
        jsonschema.Draft202012Validator(case["schema"]).validate(json.loads(text))
    except (ValueError, jsonschema.ValidationError):
        return "invalid"
    return "valid"


def _counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    found = dict.fromkeys(COUNTERS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in found and sample.labels.get("model") == MODEL:
                found[sample.name] += sample.value
    return found


def test_fast_forward_on_vs_off_wall_time_per_response(tmp_path, figures):
    servers: dict[str, RunningServer] = {}
    try:
        for side in SIDES:
            (tmp_path / side).mkdir()
            servers[side] = start_server(tmp_path / side, "--parallel", "1", "--fast-forward", side, *KEEP_LOADED)
        with httpx.Client(timeout=900) as client:
            for side in SIDES:  # the model's load is no response's time
                _ask(client, servers[side].url, SAMPLE[0])
            before = {side: _counters(servers[side].url) for side in SIDES}
            best: dict[str, list[float]] = {side: [float("inf")] * len(SAMPLE) for side in SIDES}
            totals: dict[str, list[float]] = {side: [] for side in SIDES}
            outcomes: dict[str, list[str]] = {side: [""] * len(SAMPLE) for side in SIDES}
            texts: dict[str, list[str]] = {side: [""] * len(SAMPLE) for side in SIDES}
            for round_i in range(ROUNDS):
                spent = dict.fromkeys(SIDES, 0.0)
                for i, case in enumerate(SAMPLE):
                    for side in round_order(SIDES, round_i + i):
                        elapsed, text, finish = _ask(client, servers[side].url, case)
                        best[side][i] = min(best[side][i], elapsed)
                        spent[side] += elapsed
                        outcomes[side][i], texts[side][i] = _outcome(case, text, finish), text
                for side in SIDES:
                    totals[side].append(spent[side])
            after = {side: _counters(servers[side].url) for side in SIDES}
    finally:
        for server in servers.values():
            server.stop()
    for side in SIDES:
        figures[f"fast_forward.{side}.response_ms"] = statistics.median(best[side]) * 1e3
        for outcome in ("valid", "cut", "invalid"):
            figures[f"fast_forward.{side}.{outcome}"] = outcomes[side].count(outcome)
        counts = {name: after[side][name] - before[side][name] for name in COUNTERS}
        output = max(1.0, counts["lmsp_output_tokens_total"])
        figures[f"fast_forward.{side}.forced_share"] = counts["lmsp_forced_tokens_total"] / output
        figures[f"fast_forward.{side}.output_tokens_per_step"] = output / max(1.0, counts["lmsp_engine_steps_total"])
    figures["fast_forward.on_off_wall_ratio"] = statistics.median(
        on / off for on, off in zip(best["on"], best["off"], strict=True)
    )
    repeated(
        figures, "fast_forward.round_wall_ratio", [a / b for a, b in zip(totals["on"], totals["off"], strict=True)]
    )
    figures["fast_forward.answers_differing"] = sum(a != b for a, b in zip(texts["on"], texts["off"], strict=True))
    figures["fast_forward.schemas"] = len(SAMPLE)
    # No side may answer invalid JSON under its schema: that is a failure, not a figure.
    assert figures["fast_forward.on.invalid"] == figures["fast_forward.off.invalid"] == 0, outcomes
