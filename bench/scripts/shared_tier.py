"""Issue 40, prompt states any replica can restore: conversations through a round-robin
balancer over two replicas, with the shared tier (`--cache-shared`) on and off, with the
conversations' next turns routed where their past is, and against one replica with the same
slots in total.

Four runs, one after another, each on a fresh PostgreSQL database and the same Redis (both
real, lmsp.testing_servers), the same client: C conversations, each with its own preamble, T
turns each, the whole history sent every turn as a Chat Completions stream, at most 8 at once,
round by round (every conversation's turn 1, then every turn 2, ...):

- `off`: two replicas `--parallel 4 --threads 1` behind nginx round-robin, no shared tier
  (a next turn that lands on the other replica reads its whole past again);
- `on`: the same with `--cache-shared` on one folder;
- `routed`: `on` with `--advertise-url` on each replica: a next turn that lands on the other
  replica is sent on to the one whose memory holds its past (http/affinity.py);
- `single`: one replica `--parallel 8 --threads 2`, no balancer.

Figures: later turns' (2..T) first-token p50 and p90 and the wall time of each run, and the
ratios the issue sets targets for, for `on` and for `routed`: ÷ off (later p50, ≤ 0.5) and ÷
single (≤ 1.3); the replicas' shared-tier lookups (hits, misses) and writes, and the requests
forwarded for affinity, from /metrics.

    PYTHONPATH=python:bench/lib python bench/scripts/shared_tier.py [--conversations 24]
        [--turns 4] [--preamble-words 300] [--reply-tokens 32] [--runs off,on,routed,single] [--shift]

Round-robin over two replicas with an even C and requests arriving in order sends a
conversation back to the replica that served its last turn more often than not; `--shift` puts
one other request between rounds, so that most next turns land on the other replica.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import new_database, nginx_balancer, postgres_server, redis_server
from model_streams import FILLER, MODEL, QUESTIONS, SUBJECTS, chat_history_stream, metric_sums

AT_ONCE = 8


def preamble(i: int, words: int, run: str) -> str:
    """Conversation i's own preamble; the run's name in it, so no run restores another's."""
    head = f"Conversation {i} ({run}): you are a guide to {SUBJECTS[i % len(SUBJECTS)]} for visitor number {i}."
    text = head.split()
    while len(text) < words:
        text += FILLER
    return " ".join(text[:words])


def shared_counters(url: str) -> dict[str, float]:
    wanted = {
        'lmsp_prompt_cache_shared_lookups_total{result="hit"}': "shared_hits",
        'lmsp_prompt_cache_shared_lookups_total{result="miss"}': "shared_misses",
        "lmsp_prompt_cache_shared_writes_total": "shared_writes",
        'lmsp_prompt_cache_lookups_total{result="hit"}': "local_hits",
        'lmsp_forwarded_requests_total{reason="affinity"}': "forwarded_affinity",
    }
    return metric_sums(url, wanted)


@contextlib.contextmanager
def deployment(run: str, redis: str, postgres: str, workdir: Path) -> Iterator[tuple[str, list[RunningServer]]]:
    """(the URL the client talks to, the replicas) for one run."""
    store = new_database(postgres, f"bench_{run}_{int(time.time())}")
    common = ("--store", store, "--events", redis, "--keep-alive", "-1", "--no-discover", "--preload", MODEL)
    if run == "single":
        args = [(*common, "--parallel", "8", "--threads", "2")]
    else:
        extra: tuple[str, ...] = ()
        if run in ("on", "routed"):
            extra = ("--cache-shared", str(workdir / "shared"))
        if run == "routed":  # no port: the one each listens on
            extra += ("--advertise-url", "http://127.0.0.1")
        args = [(*common, "--parallel", "4", "--threads", "1", *extra)] * 2
    servers: list[RunningServer] = []
    try:
        for i, a in enumerate(args):
            folder = workdir / f"replica-{i}"
            folder.mkdir()
            servers.append(start_server(folder, *a, timeout=300))
        for s in servers:  # the model loaded, and its digest hashed (in the background) by now
            chat_history_stream(s.url, [{"role": "user", "content": "Hello."}], 1)
        time.sleep(3)
        if len(servers) == 1:
            yield servers[0].url, servers
        else:
            with nginx_balancer([s.url for s in servers]) as balancer:
                yield balancer.url, servers
    finally:
        for s in servers:
            s.stop()


def play(url: str, run: str, n: int, turns: int, words: int, reply: int, shift: bool) -> dict[str, float]:
    histories = [[{"role": "system", "content": preamble(i, words, run)}] for i in range(n)]
    firsts: list[list[float]] = []
    cached: list[list[int]] = []
    started = time.perf_counter()
    with ThreadPoolExecutor(AT_ONCE) as pool:
        for turn in range(turns):
            if shift and turn:
                # One request of other traffic between rounds: with an even C, round-robin would
                # send each conversation back to the replica that has its past every turn.
                chat_history_stream(url, [{"role": "user", "content": "Hello."}], 1)
            for h in histories:
                h.append({"role": "user", "content": QUESTIONS[turn % len(QUESTIONS)]})
            results = list(pool.map(lambda h: chat_history_stream(url, h, reply), histories))
            for h, (_, text, _) in zip(histories, results, strict=True):
                h.append({"role": "assistant", "content": text})
            firsts.append([r[0] for r in results])
            cached.append([r[2] for r in results])
    wall = time.perf_counter() - started
    later = sorted(t for row in firsts[1:] for t in row)
    deciles = statistics.quantiles(later, n=10)
    return {
        "ttft_turn1_p50_ms": statistics.median(firsts[0]) * 1000,
        "ttft_later_p50_ms": statistics.median(later) * 1000,
        "ttft_later_p90_ms": deciles[8] * 1000,
        "wall_s": wall,
        "later_turns_with_cached_past": sum(c > 100 for row in cached[1:] for c in row),
        "later_turns": len(later),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--preamble-words", type=int, default=300)
    parser.add_argument("--reply-tokens", type=int, default=32)
    parser.add_argument("--runs", default="off,on,routed,single")
    parser.add_argument(
        "--shift", action="store_true", help="one other request between rounds: next turns land on the other replica"
    )
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    with redis_server() as redis, postgres_server() as postgres:
        for run in args.runs.split(","):
            with tempfile.TemporaryDirectory(prefix=f"lmsp-shared-{run}-") as tmp:
                with deployment(run, redis, postgres, Path(tmp)) as (url, servers):
                    figures[run] = play(
                        url, run, args.conversations, args.turns, args.preamble_words, args.reply_tokens, args.shift
                    )
                    for s in servers:
                        for k, v in shared_counters(s.url).items():
                            figures[run][k] = figures[run].get(k, 0.0) + v
            print(run, json.dumps(figures[run]), flush=True)
    ratios = {}
    for run in ("on", "routed"):
        if run in figures and "off" in figures:
            ratios[f"later_p50_{run}_vs_off"] = figures[run]["ttft_later_p50_ms"] / figures["off"]["ttft_later_p50_ms"]
        if run in figures and "single" in figures:
            single = figures["single"]
            ratios[f"later_p50_{run}_vs_single"] = figures[run]["ttft_later_p50_ms"] / single["ttft_later_p50_ms"]
            ratios[f"wall_{run}_vs_single"] = figures[run]["wall_s"] / single["wall_s"]
    print(json.dumps({"sizes": vars(args), "runs": figures, "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()
