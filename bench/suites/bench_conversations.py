"""Many conversations on few slots (issue 26): C conversations, each with its own long
preamble, several turns each, the whole history sent every turn, at most 8 requests at once,
on 8 slots: lmsp (`--parallel 8`, its prompt cache on by default) beside llama-server
(`-np 8`, 4,096 tokens a slot, its own host-memory prompt cache by default), built from the same
llama.cpp, both read as Chat Completions streams by the same client in the same run.

Turns go round by round (every conversation's turn 1, then every turn 2, ...), so that with
more conversations than slots a conversation's slot has been taken by the time its next turn
comes: what decides its first token is whether its past is read again or restored. The
servers' rounds interleave (round 1 on each server, then round 2 on each, in an order that
rotates), so that a minute in which this shared machine runs slow falls on all of them. Run
one after another, a CI run once measured all three at about half a quiet run's speed, and the
ratios moved with it.

Figures per server and C: time to first token of turn 1 and of later turns (p50, p90, ms), the
whole run's wall time (ms: the sum of that server's own rounds), and lmsp ÷ llama-server for the
later turns' p50 and the wall time.
lmsp runs twice: with its defaults (on a CPU, flash attention on, with our wheels' patched
kernel), and with `--flash-attn off` (`lmsp_flash_attn_off`, the CPU default before that patch,
when upstream's kernel was the slower at these contexts: docs/operations/concurrency.md#flash-attention).
Quick mode (LMSP_BENCH_QUICK=1): only C=24, 3 turns, shorter preambles. Sizes by environment
(for a look at one case, or the full issue's C=64 in a quick run):
LMSP_BENCH_CONVERSATIONS="8,24,64", LMSP_BENCH_TURNS, LMSP_BENCH_PREAMBLE_WORDS.

lmsp's prompt-cache counters (GET /metrics) are read over the later turns of each C: their hit
rate (`conversations.lmsp.c_N.cache_hit_rate`, restores over lookups) and the share of their
prompt tokens not decoded (`prompt_reused_share`: kept in the slot or restored) say whether
they restored their past or read it again.
"""

from __future__ import annotations

import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from figures import KEEP_LOADED, QUICK, not_measured, round_order
from llama_server import LlamaServer, ensure_llama_server
from lmsp.engine.registry import embedded_model_path
from lmsp.testing import RunningServer, free_port, start_server
from model_streams import FILLER, QUESTIONS, SUBJECTS, chat_history_stream, metric_sums

CONVERSATIONS = tuple(
    int(n) for n in os.environ.get("LMSP_BENCH_CONVERSATIONS", "24" if QUICK else "8,24,64").split(",") if n.strip()
)
TURNS = int(os.environ.get("LMSP_BENCH_TURNS", 3 if QUICK else 4))
PREAMBLE_WORDS = int(os.environ.get("LMSP_BENCH_PREAMBLE_WORDS", 250 if QUICK else 600))
REPLY_TOKENS = 32 if QUICK else 48
AT_ONCE = 8
SLOTS = 8


def preamble(i: int, n: int) -> str:
    """Conversation i's own preamble (of n: no run finds another run's in a cache)."""
    subject = SUBJECTS[i % len(SUBJECTS)]
    words = [f"Conversation {i} of {n}: you are a guide to {subject} for visitor number {i}."]
    while len(" ".join(words).split()) < PREAMBLE_WORDS:
        words.append(" ".join(FILLER))
    return " ".join(" ".join(words).split()[:PREAMBLE_WORDS])


def chat_stream(url: str, messages: list[dict[str, str]]) -> tuple[float, str]:
    first, text, _ = chat_history_stream(url, messages, REPLY_TOKENS)
    return first, text


def counters(url: str) -> dict[str, float]:
    """lmsp's prompt-cache and prompt-token counters, summed over models (GET /metrics)."""
    wanted = {
        'lmsp_prompt_cache_lookups_total{result="hit"}': "hits",
        'lmsp_prompt_cache_lookups_total{result="miss"}': "misses",
        "lmsp_prompt_cache_restored_tokens_total": "restored_tokens",
        'lmsp_prompt_tokens_total{source="decoded"}': "prompt_decoded",
        'lmsp_prompt_tokens_total{source="reused"}': "prompt_reused",
    }
    return metric_sums(url, wanted)


class Conversations:
    """n conversations on one server, played a round of turns at a time (`turn`), so that the
    servers' rounds can interleave and a machine that slows down for a minute slows them all."""

    def __init__(self, url: str, n: int) -> None:
        self.url = url
        self.histories = [[{"role": "system", "content": preamble(i, n)}] for i in range(n)]
        self.firsts: list[list[float]] = []
        self.seconds = 0.0  # the server's own rounds, not the others' between them

    def turn(self, pool: ThreadPoolExecutor) -> None:
        question = QUESTIONS[len(self.firsts) % len(QUESTIONS)]
        for history in self.histories:
            history.append({"role": "user", "content": question})
        started = time.perf_counter()
        results = list(pool.map(lambda h: chat_stream(self.url, h), self.histories))
        self.seconds += time.perf_counter() - started
        for history, (_, reply) in zip(self.histories, results, strict=True):
            history.append({"role": "assistant", "content": reply})
        self.firsts.append([ttft for ttft, _ in results])

    def figures(self) -> dict[str, float]:
        later = [t for firsts in self.firsts[1:] for t in firsts]

        def pct(values: list[float], q: int) -> float:
            return statistics.quantiles(values, n=10)[q // 10 - 1] * 1000 if len(values) > 1 else values[0] * 1000

        return {
            "ttft_turn1_p50_ms": pct(self.firsts[0], 50),
            "ttft_turn1_p90_ms": pct(self.firsts[0], 90),
            "ttft_later_p50_ms": pct(later, 50),
            "ttft_later_p90_ms": pct(later, 90),
            "wall_ms": self.seconds * 1000,
        }


# Minutes in quick mode on an idle 2-core machine; a loaded one is many times slower.
@pytest.mark.timeout(7200)
def test_conversations_beyond_the_slots(tmp_path, figures):
    try:
        binary = ensure_llama_server()
        theirs: LlamaServer | None = LlamaServer(binary, embedded_model_path(), free_port(), parallel=SLOTS)  # type: ignore[arg-type]
        reason = ""
    except (OSError, RuntimeError) as exc:
        theirs, reason = None, " ".join(str(exc).split())
    ours = start_server(tmp_path, "--parallel", str(SLOTS), *KEEP_LOADED)
    flash: RunningServer | None = None
    try:
        flash_dir = tmp_path / "flash-attn-off"
        flash_dir.mkdir()
        flash = start_server(flash_dir, "--parallel", str(SLOTS), *KEEP_LOADED, "--flash-attn", "off")
        urls = {"lmsp": ours.url, "lmsp_flash_attn_off": flash.url}
        if theirs is not None:
            urls["llama_server_np8"] = theirs.url
        for n in CONVERSATIONS:
            runs = {server: Conversations(url, n) for server, url in urls.items()}
            before: dict[str, float] = {}
            with ThreadPoolExecutor(AT_ONCE) as pool:
                for turn in range(TURNS):
                    for server in round_order(tuple(runs), turn):
                        runs[server].turn(pool)
                        if server == "lmsp" and turn == 0:
                            before = counters(ours.url)
            got = {server: run.figures() for server, run in runs.items()}
            after = counters(ours.url)  # the later turns' counts: turn 1 has nothing to reuse
            seen = {name: after[name] - before[name] for name in after}
            for name in ("hits", "misses", "restored_tokens"):
                figures[f"conversations.lmsp.c_{n}.cache_{name}"] = seen[name]
            # A lookup that a conversation's own slot made needless counts as a miss: the hit
            # rate is of the lookups, the reused share of every prompt token (slot or cache).
            lookups = seen["hits"] + seen["misses"]
            figures[f"conversations.lmsp.c_{n}.cache_hit_rate"] = seen["hits"] / lookups if lookups else 0.0
            prompt = seen["prompt_reused"] + seen["prompt_decoded"]
            figures[f"conversations.lmsp.c_{n}.prompt_reused_share"] = seen["prompt_reused"] / prompt if prompt else 0.0
            for server, values in got.items():
                for name, value in values.items():
                    figures[f"conversations.{server}.c_{n}.{name}"] = value
            for ours_name in ("lmsp", "lmsp_flash_attn_off"):
                for name in ("ttft_later_p50_ms", "wall_ms"):
                    key = f"conversations.{ours_name}_vs_llama_server.c_{n}.{name.removesuffix('_ms')}_ratio"
                    if theirs is not None:
                        figures[key] = got[ours_name][name] / got["llama_server_np8"][name]
                    else:
                        figures[key] = not_measured(reason)
    finally:
        ours.stop()
        if flash is not None:  # its start failed: the others are stopped all the same
            flash.stop()
        if theirs is not None:
            theirs.stop()
