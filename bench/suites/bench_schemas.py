"""Structured output on real schemas (issue 39): a fixed sample of JSONSchemaBench's real-world
schemas (bench/data/jsonschemabench, 30 from each of its 10 sets), each asked once through Chat
Completions with `response_format: json_schema` at T=0, from lmsp and from
llama-server built from the same llama.cpp (bench/lib/llama_server.py), schema by schema, the
servers' order rotating (`round_order`) so that a slow minute of the machine falls on both.
lmsp runs twice: `lmsp` with grammar fast-forward on (`--fast-forward on`, named: it is not the
default) and `lmsp_ff_off` with it off (the default).

Each response is one of:

- `valid`: finished, and its JSON validates against the whole schema (jsonschema-rs; `format` as
  an annotation, as JSON Schema's later drafts make it, for every server alike);
- `cut`: stopped by the token budget (`finish_reason: length`);
- `invalid`: finished, but not JSON or not valid against the schema;
- `refused`: a 4xx (the schema was not accepted);
- `error`: anything else (a 5xx: lmsp's `generation_failed` when a value broke a keyword only
  checked at the end; a closed connection; a timeout).

Figures per server (`schemas.SERVER.*`): each class's count, `coverage` ((valid + cut) ÷ sample),
`answered_p50_s` (the median wall time of an answered response); and for lmsp ÷ llama-server:
`answered_minus_llama_server` (answered schemas, a count ≥ 0 is the target) and `time_ratio`
(the median time over the schemas both answered, ÷ the same for llama-server). Which schemas
each server did not answer, and why, are in `schemas.SERVER.not_answered` (set/id: class, the
first words of the reason): what to study next.

Quick mode (LMSP_BENCH_QUICK=1): the sample's rows marked `quick` (the smallest schema of each
set's draw, 10), 64 tokens each. For a partial run of the full bench: LMSP_BENCH_SCHEMAS_PER_SET=N (the
first N of each set's draw) and LMSP_BENCH_SCHEMA_TOKENS (the budget, 384 by default).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import pytest

from figures import KEEP_LOADED, QUICK, not_measured, round_order
from llama_server import LlamaServer, ensure_llama_server
from lmsp.engine.registry import embedded_model_path
from lmsp.testing import RunningServer, free_port, start_server

MODEL = "smollm2:135m-instruct-q4_1"
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "jsonschemabench" / "sample.jsonl"
ROWS: list[dict[str, Any]] = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
MAX_TOKENS = 64 if QUICK else int(os.environ.get("LMSP_BENCH_SCHEMA_TOKENS", "384"))
CLASSES = ("valid", "cut", "invalid", "refused", "error")
REQUEST_TIMEOUT_S = 300.0


def cases() -> list[dict[str, Any]]:
    if QUICK:
        return [row for row in ROWS if row["quick"]]
    per_set = int(os.environ.get("LMSP_BENCH_SCHEMAS_PER_SET", "0"))
    if not per_set:
        return ROWS
    seen: Counter[str] = Counter()
    chosen = []
    for row in ROWS:  # each set's rows are in the order they were drawn
        seen[row["set"]] += 1
        if seen[row["set"]] <= per_set:
            chosen.append(row)
    return chosen


def prompt(row: dict[str, Any]) -> str:
    """The same words to every server: what the schema says it is for, when it says so."""
    schema = row["schema"]
    about = " ".join(str(schema.get(k, "")) for k in ("title", "description") if isinstance(schema.get(k), str))
    about = " ".join(about.split())[:300]
    return "Write one realistic example as JSON." + (f" It is: {about}" if about else "")


def payload(row: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt(row)}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": row["schema"]}},
    }


def validator(schema: dict[str, Any]) -> Any:
    """The whole schema's validator, or None when jsonschema-rs cannot read it (then a finished
    answer counts as valid when it is JSON: no server is judged on what cannot be checked)."""
    try:
        return jsonschema_rs.validator_for(schema, validate_formats=False)
    except (jsonschema_rs.ValidationError, ValueError):
        return None


def classify(status: int | None, body: Any, check: Any) -> tuple[str, str]:
    """(class, why) of one Chat Completions answer; `status` None: no HTTP answer at all."""
    if status is None:
        return "error", str(body)[:120]
    if 400 <= status < 500:
        return "refused", _reason(body)
    if status != 200:
        return "error", f"{status} {_reason(body)}"
    try:
        choice = body["choices"][0]
        content, finish = choice["message"]["content"], choice["finish_reason"]
    except (KeyError, IndexError, TypeError):
        return "error", f"200 without a choice: {str(body)[:100]}"
    if finish == "length":
        return "cut", ""
    try:
        value = json.loads(content)
    except (TypeError, ValueError):
        return "invalid", f"not JSON: {str(content)[:80]}"
    if check is not None:
        for err in check.iter_errors(value):
            return "invalid", f"at /{'/'.join(map(str, err.instance_path))}: {err.message[:80]}"
    return "valid", ""


def _reason(body: Any) -> str:
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            return " ".join(str(err.get("message") or err.get("detail") or err).split())[:160]
    return " ".join(str(body).split())[:160]


def ask(client: httpx.Client, row: dict[str, Any]) -> tuple[int | None, Any, float]:
    started = time.perf_counter()
    try:
        r = client.post("/v1/chat/completions", json=payload(row))
    except httpx.HTTPError as exc:
        return None, f"{type(exc).__name__}: {exc}", time.perf_counter() - started
    elapsed = time.perf_counter() - started
    try:
        body = r.json()
    except ValueError:
        body = r.text
    return r.status_code, body, elapsed


def summarize(figures: dict[str, Any], server: str, results: list[tuple[str, str, float]], n: int) -> None:
    counts = Counter(kind for kind, _, _ in results)
    for kind in CLASSES:
        figures[f"schemas.{server}.{kind}"] = counts.get(kind, 0)
    figures[f"schemas.{server}.coverage"] = (counts["valid"] + counts["cut"]) / n
    answered = [t for kind, _, t in results if kind in ("valid", "cut")]
    median = statistics.median(answered) if answered else not_measured("none answered")
    figures[f"schemas.{server}.answered_p50_s"] = median


@pytest.mark.timeout(14400)
def test_real_world_schemas_lmsp_vs_llama_server(tmp_path, figures):
    rows = cases()
    checks = [validator(row["schema"]) for row in rows]
    figures["schemas.sample"] = len(rows)
    figures["schemas.max_tokens"] = MAX_TOKENS
    figures["schemas.uncheckable"] = sum(1 for c in checks if c is None)
    servers: dict[str, RunningServer | LlamaServer] = {}
    reason = ""
    try:
        for name, flags in (("lmsp", ("--fast-forward", "on")), ("lmsp_ff_off", ("--fast-forward", "off"))):
            (tmp_path / name).mkdir()
            servers[name] = start_server(tmp_path / name, *KEEP_LOADED, *flags)
        try:
            servers["llama_server"] = LlamaServer(ensure_llama_server(), embedded_model_path(), free_port(), parallel=1)  # type: ignore[arg-type]
        except (OSError, RuntimeError) as exc:
            reason = " ".join(str(exc).split())
        clients = {name: httpx.Client(base_url=s.url, timeout=REQUEST_TIMEOUT_S) for name, s in servers.items()}
        results: dict[str, list[tuple[str, str, float]]] = {name: [] for name in servers}
        for i, (row, check) in enumerate(zip(rows, checks, strict=True)):
            for name in round_order(tuple(servers), i):
                status, body, elapsed = ask(clients[name], row)
                kind, why = classify(status, body, check)
                results[name].append((kind, why, elapsed))
        for client in clients.values():
            client.close()
    finally:
        for s in servers.values():
            s.stop()
    for name, got in results.items():
        summarize(figures, name, got, len(rows))
        missed = [
            f"{row['set']}/{row['id']}: {kind} {why}".strip()
            for row, (kind, why, _) in zip(rows, got, strict=True)
            if kind not in ("valid", "cut")
        ]
        figures[f"schemas.{name}.not_answered"] = "; ".join(missed)[:3000] or "none"
    for ours in [name for name in results if name.startswith("lmsp")]:
        key = f"schemas.{ours}_vs_llama_server"
        if "llama_server" not in results:
            figures[f"{key}.time_ratio"] = not_measured(reason or "llama-server did not start")
            figures[f"{key}.answered_minus_llama_server"] = not_measured(reason or "llama-server did not start")
            continue
        figures[f"{key}.answered_minus_llama_server"] = _answered(results[ours]) - _answered(results["llama_server"])
        figures[f"{key}.time_ratio"] = _time_ratio(results[ours], results["llama_server"])
    figures["schemas.lmsp_ff_on_vs_off.time_ratio"] = _time_ratio(results["lmsp"], results["lmsp_ff_off"])


def _answered(results: list[tuple[str, str, float]]) -> int:
    return sum(1 for kind, _, _ in results if kind in ("valid", "cut"))


def _time_ratio(ours: list[tuple[str, str, float]], theirs: list[tuple[str, str, float]]) -> float | str:
    """Median time of `ours` ÷ median time of `theirs`, over the schemas both answered."""
    both = [
        (a[2], b[2]) for a, b in zip(ours, theirs, strict=True) if a[0] in ("valid", "cut") and b[0] in ("valid", "cut")
    ]
    if not both:
        return not_measured("no schema answered by both")
    return statistics.median(a for a, _ in both) / statistics.median(b for _, b in both)
