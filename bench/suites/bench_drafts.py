"""Prompt-lookup drafts (issue 39) on an edit workload: a short plain English text asked back
with one word changed, T=0, one request at a time (an editor waits for each), over Chat
Completions. lmsp with drafts and with `--draft off`, both with `--flash-attn on` (llama-server's
own choice on a CPU, and where `--draft auto` drafts), beside llama-server built from
the same llama.cpp without speculation and with its own n-gram speculation
(`--spec-type ngram-simple`), in rotating order round by round: tokens/s and wall time per
answer, lmsp's ratios to each, its draft acceptance and tokens per decode step (/metrics), and
whether the drafted texts equal the plain ones (they must, byte for byte)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from figures import KEEP_LOADED, QUICK, not_measured, repeated, round_order
from llama_server import LlamaServer, ensure_llama_server
from lmsp.engine.registry import embedded_model_path
from lmsp.testing import RunningServer, free_port, start_server

MODEL = "smollm2:135m-instruct-q4_1"
# ~60 words each: what the embedded 135M model copies faithfully (it drops or rewords longer ones).
TEXTS = [
    (
        "The old lighthouse stood at the edge of the cliff, its blue door facing the sea. Every evening "
        "the keeper climbed the narrow stairs, lit the lamp, and watched the ships pass slowly in the "
        "dark. In the morning he wrote a few lines in his book about the wind, the waves and the birds.",
        "blue",
        "green",
    ),
    (
        "Our team meets every Monday at nine in the small room next to the kitchen. We talk about the "
        "work of the past week, plan the next one, and write down who does what. The meeting is short, "
        "rarely longer than half an hour, and anyone may bring a question or an idea to the table.",
        "Monday",
        "Tuesday",
    ),
    (
        "The garden behind the house has three apple trees, a row of tomatoes and a small pond with "
        "fish. In spring the children plant flowers along the fence, and in summer the whole family "
        "eats dinner outside under the trees. In autumn they pick the apples and make juice for winter.",
        "three",
        "four",
    ),
]
ROUNDS = 2 if QUICK else 5
CASES = TEXTS[:2] if QUICK else TEXTS
MAX_TOKENS = 160
# llama-server's n-gram speculation: its simplest kind, with a lookup and draft as long as ours
# (its defaults, 12 and 48, need 12 tokens to match before anything is drafted).
LLAMA_NGRAM = (
    "--spec-type",
    "ngram-simple",
    "--spec-ngram-simple-size-n",
    "3",
    "--spec-ngram-simple-size-m",
    "8",
    "--spec-draft-n-max",
    "8",
)


def _ask(url: str, text: str, old: str, new: str) -> tuple[float, int, str]:
    """(seconds, completion tokens, text) of one non-streamed T=0 answer."""
    prompt = f"Repeat the following text exactly, but change the word '{old}' to '{new}':\n\n{text}"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
    }
    started = time.perf_counter()
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
    seconds = time.perf_counter() - started
    if r.status_code != 200:
        raise AssertionError(f"{url} answered {r.status_code}: {r.text}")
    data: dict[str, Any] = r.json()
    return seconds, int(data["usage"]["completion_tokens"]), data["choices"][0]["message"]["content"]


def _draft_counters(url: str) -> dict[str, float]:
    got = {"proposed": 0.0, "accepted": 0.0, "steps": 0.0, "output": 0.0}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        series, value = line.rsplit(" ", 1)
        for key, name in (
            ('lmsp_draft_tokens_total{model="' + MODEL + '",result="proposed"}', "proposed"),
            ('lmsp_draft_tokens_total{model="' + MODEL + '",result="accepted"}', "accepted"),
            ('lmsp_engine_steps_total{model="' + MODEL + '"}', "steps"),
            ('lmsp_output_tokens_total{model="' + MODEL + '"}', "output"),
        ):
            if series == key:
                got[name] += float(value)
    return got


# Quick mode: about a minute on an idle 2-core machine (four servers, two texts, two rounds).
@pytest.mark.timeout(3600)
def test_edit_workload_drafts_against_llama_server(tmp_path: Path, figures: dict[str, Any]) -> None:
    servers: dict[str, str] = {}
    ours: list[RunningServer] = []
    theirs: list[LlamaServer] = []
    reason = ""
    try:
        for name, draft in (("lmsp_drafts", "auto"), ("lmsp_plain", "off")):
            home = tmp_path / name
            home.mkdir()
            ours.append(start_server(home, "--parallel", "1", "--flash-attn", "on", "--draft", draft, *KEEP_LOADED))
            servers[name] = ours[-1].url
        try:
            binary = ensure_llama_server()
            for name, extra in (("llama_server", ()), ("llama_server_ngram", LLAMA_NGRAM)):
                theirs.append(LlamaServer(binary, embedded_model_path(), free_port(), parallel=1, extra=extra))
                servers[name] = theirs[-1].url
        except (OSError, RuntimeError) as exc:
            reason = " ".join(str(exc).split())
        for url in servers.values():  # each loads its model and reads the template once, untimed
            _ask(url, *CASES[0])
        before = _draft_counters(servers["lmsp_drafts"])
        rates: dict[str, list[float]] = {name: [] for name in servers}
        walls: dict[str, list[float]] = {name: [] for name in servers}
        texts: dict[str, list[str]] = {name: [] for name in servers}
        for i in range(ROUNDS):
            for name in round_order(tuple(servers), i):
                seconds = tokens = 0.0
                for case in CASES:
                    s, n, text = _ask(servers[name], *case)
                    seconds, tokens = seconds + s, tokens + n
                    if i == 0:
                        texts[name].append(text)
                rates[name].append(tokens / seconds)
                walls[name].append(seconds * 1000 / len(CASES))
        after = _draft_counters(servers["lmsp_drafts"])
    finally:
        for server in ours:
            server.stop()
        for other in theirs:
            other.stop()
    for name in servers:
        repeated(figures, f"drafts.edit.{name}.tok_per_s", rates[name])
        repeated(figures, f"drafts.edit.{name}.wall_ms", walls[name])
    seen = {key: after[key] - before[key] for key in after}
    figures["drafts.edit.lmsp.acceptance"] = seen["accepted"] / seen["proposed"] if seen["proposed"] else 0.0
    figures["drafts.edit.lmsp.tokens_per_step"] = seen["output"] / seen["steps"] if seen["steps"] else 0.0
    # Byte-identical T=0 text with drafts and without: a count that must be 0.
    figures["drafts.edit.lmsp.texts_differing"] = sum(
        a != b for a, b in zip(texts["lmsp_drafts"], texts["lmsp_plain"], strict=True)
    )
    pairs = (("on_off", "lmsp_plain"), ("lmsp_vs_llama_server", "llama_server"))
    pairs += (("lmsp_vs_llama_server_ngram", "llama_server_ngram"),)
    for label, other in pairs:
        key = f"drafts.edit.{label}"
        if other not in servers:
            figures[f"{key}.tok_per_s_ratio"] = figures[f"{key}.wall_ratio"] = not_measured(reason)
            continue
        figures[f"{key}.tok_per_s_ratio"] = (
            figures["drafts.edit.lmsp_drafts.tok_per_s"] / figures[f"drafts.edit.{other}.tok_per_s"]
        )
        figures[f"{key}.wall_ratio"] = (
            figures["drafts.edit.lmsp_drafts.wall_ms"] / figures[f"drafts.edit.{other}.wall_ms"]
        )
    assert figures["drafts.edit.lmsp.texts_differing"] == 0, texts
