"""A conversation continued after a restart (issue 26): with `--cache-dir`, what the slots held
when the service stopped is on disk, and the next turn restores its past instead of reading it
again. Target: time to first token of the continuation ≤ 0.2× that of the same continuation on
a server that must re-read it.

One conversation (a ~600-word preamble, a few short turns) on `lmsp serve --cache-dir`; the
service is stopped (SIGTERM: the slots go to disk) and started again on the same folder; the
next turn's time to first token is measured there and on a server without the cache (its
`--cache-ram 0`, its slot holding another prompt), one after the other. Quick mode: one restart, two
turns before it (a few seconds of prefill); else three restarts, the medians.

Figures: `restart.lmsp.ttft_cached_ms`, `restart.lmsp.ttft_reread_ms`, their ratio
`restart.cached_vs_reread.ttft_ratio` (the report shows it beside its target), and the cached
tokens the continuation reported (`restart.lmsp.cached_tokens`: 0 would mean no restore).
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path

import pytest

from figures import KEEP_LOADED, QUICK, repeated
from lmsp.testing import RunningServer, start_server
from model_streams import chat_history_stream

PREAMBLE_WORDS = 600
TURNS = 2 if QUICK else 4
RESTARTS = 1 if QUICK else 3
REPLY_TOKENS = 8 if QUICK else 32
SENTENCE = (
    "You are a patient guide to sailing small boats on lakes: you explain knots, wind, balance, "
    "right of way and safety, you answer plainly, and you keep every answer short and practical."
).split()
QUESTIONS = ("Where do I start?", "Which knot first?", "What about wind?", "And capsizing?", "One last tip?")


def preamble() -> str:
    words: list[str] = []
    while len(words) < PREAMBLE_WORDS:
        words.extend(SENTENCE)
    return " ".join(words[:PREAMBLE_WORDS])


def chat(url: str, messages: list[dict[str, str]]) -> tuple[float, str, int]:
    return chat_history_stream(url, messages, REPLY_TOKENS)


def serve(tmp_path: Path, *args: str) -> RunningServer:
    return start_server(tmp_path, "--parallel", "1", *KEEP_LOADED, *args)


@pytest.mark.timeout(1800)
def test_continuation_after_restart(tmp_path, figures):
    cache_dir = tmp_path / "kv"
    messages = [{"role": "system", "content": preamble()}]
    cached_ms: list[float] = []
    reread_ms: list[float] = []
    cached_tokens: list[int] = []
    ours = serve(tmp_path, "--cache-dir", str(cache_dir))
    try:  # the conversation so far, ended by the restart (SIGTERM: the slot goes to disk)
        for turn in range(TURNS):
            messages.append({"role": "user", "content": QUESTIONS[turn]})
            messages.append({"role": "assistant", "content": chat(ours.url, messages)[1]})
    finally:
        ours.stop()
    continue_with = [*messages, {"role": "user", "content": QUESTIONS[TURNS]}]
    # Every restart starts from the folder as that stop left it (a stop after the continuation
    # would keep a longer state, and the next restart would measure something else).
    saved = tmp_path / "kv-at-restart"
    shutil.copytree(cache_dir, saved)
    reread = serve(tmp_path, "--cache-ram", "0")
    try:
        chat(reread.url, [{"role": "user", "content": "Hello."}])  # warm: both have answered once
        for _ in range(RESTARTS):
            shutil.rmtree(cache_dir)
            shutil.copytree(saved, cache_dir)
            ours = serve(tmp_path, "--cache-dir", str(cache_dir))
            try:
                chat(ours.url, [{"role": "user", "content": "Hello."}])
                ttft, _, cached = chat(ours.url, continue_with)
            finally:
                ours.stop()
            cached_ms.append(ttft * 1000)
            cached_tokens.append(cached)
            chat(reread.url, [{"role": "user", "content": "Something else entirely."}])  # its slot: not this
            reread_ms.append(chat(reread.url, continue_with)[0] * 1000)
    finally:
        reread.stop()
    repeated(figures, "restart.lmsp.ttft_cached_ms", cached_ms)
    repeated(figures, "restart.lmsp.ttft_reread_ms", reread_ms)
    figures["restart.lmsp.cached_tokens"] = min(cached_tokens)
    figures["restart.cached_vs_reread.ttft_ratio"] = statistics.median(
        c / r for c, r in zip(cached_ms, reread_ms, strict=True)
    )
