"""Issue 38's prompt-prefix oracle, measured: what owner B learns of owner A's prompt from
`cached_tokens` and from the time to answer.

One server (`--cache-ram`, two slots), two tokens. Each round: owner A sends a fresh long
prompt (cold), A sends it again (its own cache), B sends the same prompt, and B sends a fresh
prompt of the same length (cold, the control). B's time for A's prompt should be a cold time,
not A's warm one. Rounds interleave so a slow minute falls on every kind.

    python bench/scripts/cache_oracle.py [ROUNDS] [--cache-scope owner|shared]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from lmsp.security.scopes import parse_scopes
from lmsp.testing import start_server
from lmsp.tokens.sqlite import TokenStore

MODEL = "smollm2:135m-instruct-q4_1"


def _prompt(i: int) -> str:
    # ~1,300 tokens, distinct per round from its first words on.
    return f"Round {i}. " + " ".join(f"Item {i}-{k}: a plain sentence about topic {k % 17}." for k in range(110))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("rounds", type=int, nargs="?", default=3)
    parser.add_argument("--cache-scope", default="owner")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp())
    data = work / "data"
    store = TokenStore(data)
    try:
        secrets = {who: store.create(parse_scopes("models:read,responses:write"), who)[0] for who in ("a", "b")}
    finally:
        store.close()
    server = start_server(
        work, "--parallel", "2", "--keep-alive", "-1", "--no-discover", "--cache-ram", "256",
        "--data-dir", str(data), "--cache-scope", args.cache_scope,
    )  # fmt: skip
    times: dict[str, list[float]] = {"a cold": [], "a again": [], "b on a's prompt": [], "b cold": []}
    cached: dict[str, list[int]] = {k: [] for k in times}
    try:
        with httpx.Client(base_url=server.url, timeout=300) as client:

            def ask(kind: str, who: str, text: str) -> None:
                body = {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
                start = time.perf_counter()
                r = client.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {secrets[who]}"})
                times[kind].append(time.perf_counter() - start)
                r.raise_for_status()
                cached[kind].append(r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))

            for i in range(args.rounds):
                ask("a cold", "a", _prompt(2 * i))
                ask("a again", "a", _prompt(2 * i))
                ask("b on a's prompt", "b", _prompt(2 * i))
                ask("b cold", "b", _prompt(2 * i + 1))
    finally:
        server.stop()
    for kind in times:
        print(f"{kind:>16}: {statistics.median(times[kind]):6.2f} s median, cached_tokens {cached[kind]}")
    ratio = statistics.median(times["b on a's prompt"]) / statistics.median(times["b cold"])
    print(f"b on a's prompt / b cold: {ratio:.2f} (1.0: B learns nothing from the time)")
    sys.exit(0)


if __name__ == "__main__":
    main()
