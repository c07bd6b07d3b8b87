"""Two servers on the real embedded model, N streams at once, in alternating rounds: the
median of per-round ratios (tokens/s and slowest first token), which the drift of a shared
machine moves far less than either server's own figures. A script, not part of `pytest bench`:

    python bench/scripts/paired.py                           # this checkout vs llama-server -np 8
    python bench/scripts/paired.py --baseline-src ../old/python   # vs another checkout's python/ (its
                                                          # lmsp/_core*.so built or copied in)
    python bench/scripts/paired.py --streams 1 --rounds 12

On the 2-core CI machine one round's ratio moves ±15 %; ten rounds or more tell a 5 % change.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))  # bench/lib: shared with the suites

from llama_server import LlamaServer, ensure_llama_server
from lmsp.engine.registry import embedded_model_path
from lmsp.testing import RunningServer, free_port, isolated_env, start_server
from model_streams import PROMPTS, engine_seconds, fan_out, host_share, llama_server_stream, lmsp_stream, render


def _lmsp(src: str | None) -> RunningServer:
    """`lmsp serve --parallel 8`, from this checkout or from the python/ folder `src`."""
    workdir = Path(tempfile.mkdtemp(prefix="lmsp-paired-"))
    env = isolated_env(workdir / "user")
    if src is not None:
        env["PYTHONPATH"] = str(Path(src).resolve())
    return start_server(workdir, "--parallel", "8", env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=8, choices=range(1, len(PROMPTS) + 1))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--baseline-src", help="another lmsp's python/ folder (default: llama-server -np 8)")
    args = parser.parse_args()

    ours = _lmsp(None)
    stop: list[Callable[[], None]] = [ours.stop]
    try:
        if args.baseline_src:
            base = _lmsp(args.baseline_src)
            stop.append(base.stop)
            theirs_url, theirs_stream, name = base.url, lmsp_stream, f"lmsp from {args.baseline_src}"
            prepare: Callable[[list[str]], list[str]] = list  # the prompts as they are
        else:
            server = LlamaServer(ensure_llama_server(), embedded_model_path(), free_port(), parallel=8)  # type: ignore[arg-type]
            stop.append(server.stop)
            theirs_url, theirs_stream, name, prepare = server.url, llama_server_stream, "llama-server -np 8", render
        lmsp_stream(ours.url, "Hello")  # neither pays for a cold start
        theirs_stream(theirs_url, prepare(["Hello"])[0])
        speed, first, share = [], [], []
        for r in range(args.rounds):
            texts = [f"Take {r}.{os.getpid()}. {p}" for p in PROMPTS[: args.streams]]
            runs = [
                ("ours", lambda texts=texts: fan_out(lmsp_stream, ours.url, texts)),
                ("theirs", lambda texts=texts: fan_out(theirs_stream, theirs_url, prepare(texts))),
            ]
            engine = engine_seconds(ours.url)
            got = dict((who, run()) for who, run in (runs if r % 2 == 0 else runs[::-1]))  # who goes first alternates
            share.append(host_share(engine, engine_seconds(ours.url)))
            speed.append(got["ours"]["tok_per_s"] / got["theirs"]["tok_per_s"])
            first.append(got["ours"]["slowest_ttft_s"] / got["theirs"]["slowest_ttft_s"])
            print(
                f"round {r}: ours {got['ours']['tok_per_s']:.1f} tok/s,"
                f" slowest first token {got['ours']['slowest_ttft_s'] * 1e3:.0f} ms,"
                f" host {share[-1]:.1%} of the scheduler's time"
                f" | {name} {got['theirs']['tok_per_s']:.1f}, {got['theirs']['slowest_ttft_s'] * 1e3:.0f} ms"
                f" | ratios {speed[-1]:.3f}, {first[-1]:.3f}",
                flush=True,
            )
    finally:
        for s in stop:
            s()
    print(
        f"{args.streams} streams, {args.rounds} rounds, ours vs {name}:"
        f" tokens/s ratio median {statistics.median(speed):.3f} (ours ahead in {sum(x > 1 for x in speed)}),"
        f" slowest first token ratio median {statistics.median(first):.3f};"
        f" our scheduler's host share median {statistics.median(share):.1%}"
    )


if __name__ == "__main__":
    main()
