"""The two workloads of issue 53, outside the bench, for profiling a running server:

    python bench/scripts/backpressure_probe.py events --streams 8 [--profile on.svg]
    python bench/scripts/backpressure_probe.py stalled [--profile slow.svg]

`events`: two services on the scripted model, one default and one `--max-stream-buffer 0`;
`--streams` concurrent `POST /lmsp/v1/responses` streams read as fast as they can,
`--events` events a round in all, rounds alternating between the services; prints events/s
of each and on ÷ off. `stalled`: one service on the embedded model; 4 streams of 200 tokens
beside one long scripted stream (4 KiB every 8 ms) whose reader reads at full speed, or 1
byte a second from a 4 KiB receive buffer, alternating; prints the 4 streams' deltas/s beside each. `--profile` runs
py-spy on the service (`--side`'s for `events`, during its rounds; the first stalled round
for `stalled`) and writes its flame graph, or its raw stacks to a `.txt` name."""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))

from figures import KEEP_LOADED, SCRIPTED, round_order
from lmsp.testing import RunningServer, start_server
from procstat import cpu_seconds
from sse_client import SseStream
from stalled_reader import LONG_EVENTS, LONG_TEXT, long_reader, responses_body

MODEL = "smollm2:135m-instruct-q4_1"


async def _streams_round(port: int, streams: int, each: int) -> float:
    """Events/s in all of `streams` scripted POST streams of `each` deltas started together."""
    readers = [
        SseStream(port, "POST", "/lmsp/v1/responses", responses_body(SCRIPTED, "!repeat tok", each))
        for _ in range(streams)
    ]
    started = time.perf_counter()
    await asyncio.gather(*(r.run() for r in readers))
    seconds = time.perf_counter() - started
    for r in readers:
        assert r.events == each + 4, f"{r.events} events of {each + 4}"
    return sum(r.events for r in readers) / seconds


class Profile:
    """py-spy recording a service's process until `stop`."""

    def __init__(self, pid: int, out: str | None) -> None:
        self.proc = None
        if out:
            cmd = [
                "py-spy",
                "record",
                "--pid",
                str(pid),
                "--output",
                out,
                "--format",
                "raw" if out.endswith(".txt") else "flamegraph",
                "--rate",
                "250",
                "--nonblocking",
                "--threads",
            ]
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(2)
            self.proc.wait(60)


def events(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bp-probe-"))
    for side in ("on", "off"):
        (workdir / side).mkdir()
    # A POST stream's ring holds 65,536 events and 16 MiB: a writer that falls that far behind
    # ~1M events/s of generation loses events (event_history_expired), either side.
    each = min(args.events // args.streams, 40_000)
    common = ("--scripted-model", SCRIPTED, "--max-output-tokens", "1000000", "--parallel", str(args.streams))
    servers = {
        "on": start_server(workdir / "on", *common, *KEEP_LOADED),
        "off": start_server(workdir / "off", *common, *KEEP_LOADED, "--max-stream-buffer", "0"),
    }
    rates: dict[str, list[float]] = {side: [] for side in servers}
    cpu: dict[str, list[float]] = {side: [] for side in servers}
    try:
        for srv in servers.values():
            asyncio.run(_streams_round(srv.port, args.streams, each))  # warm
        profile = Profile(servers[args.side].proc.pid, args.profile)
        for i in range(args.rounds):
            for side in round_order(tuple(servers), i):
                before = cpu_seconds(servers[side].proc.pid)
                rates[side].append(asyncio.run(_streams_round(servers[side].port, args.streams, each)))
                # The service's CPU per event: what it does for a stream, whatever the client's speed.
                cpu[side].append((cpu_seconds(servers[side].proc.pid) - before) / (each * args.streams) * 1e6)
        profile.stop()
    finally:
        for srv in servers.values():
            srv.stop()
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    rounds = [a / b for a, b in zip(rates["on"], rates["off"], strict=True)]
    print(f"{args.streams} streams, {each * args.streams} events a round, {args.rounds} rounds")
    print(
        f"  on {on:,.0f} events/s, off {off:,.0f}: on/off {on / off:.3f}",
        f"(rounds {', '.join(f'{r:.2f}' for r in rounds)})",
    )
    con, coff = statistics.median(cpu["on"]), statistics.median(cpu["off"])
    print(f"  service CPU per event: on {con:.2f} us, off {coff:.2f} us: on/off {con / coff:.3f}")


async def _beside(port: int, fast: bool, tokens: int, k: int) -> float:
    """The 4 short streams' mean deltas/s (between each one's first and last events) while a
    long stream runs beside them."""
    stop = threading.Event()
    long_body = responses_body(SCRIPTED, LONG_TEXT, LONG_EVENTS)
    long = threading.Thread(target=long_reader, args=(port, long_body, fast, stop), daemon=True)
    long.start()
    await asyncio.sleep(10.0)  # a stalled reader is past its bound by then
    readers = [
        SseStream(
            port, "POST", "/lmsp/v1/responses", responses_body(MODEL, f"Tell me about rivers, take {k}.{j}.", tokens)
        )
        for j in range(4)
    ]
    await asyncio.gather(*(r.run() for r in readers))
    stop.set()
    long.join(5)
    rates = []
    for r in readers:
        first, last = r.arrivals[0][0], r.arrivals[-1][0]
        rates.append((r.events - r.arrivals[0][1]) / (last - first))
    return statistics.mean(rates)


def stalled(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bp-probe-"))
    srv: RunningServer = start_server(
        workdir,
        *("--scripted-model", SCRIPTED, "--max-output-tokens", str(LONG_EVENTS), "--parallel", "4"),
        *("--stream-write-timeout", "600", *KEEP_LOADED),
    )
    rates: dict[str, list[float]] = {"fast": [], "slow": []}
    try:
        asyncio.run(_beside(srv.port, True, 8, -1))  # warm
        for i in range(args.rounds):
            for side in round_order(("fast", "slow"), i):
                profile = Profile(srv.proc.pid, args.profile if side == "slow" and i == 0 else None)
                rates[side].append(asyncio.run(_beside(srv.port, side == "fast", args.tokens, i)))
                profile.stop()
    finally:
        srv.stop()
    fast, slow = statistics.median(rates["fast"]), statistics.median(rates["slow"])
    print(f"4 streams of {args.tokens} tokens beside a long one, {args.rounds} rounds")
    print(f"  beside a fast reader {fast:.1f} deltas/s each, beside a stalled one {slow:.1f}: {slow / fast:.3f}")
    print(f"  rounds fast {rates['fast']}, slow {rates['slow']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="workload", required=True)
    e = sub.add_parser("events")
    e.add_argument("--streams", type=int, default=8)
    e.add_argument("--events", type=int, default=600_000)
    e.add_argument("--rounds", type=int, default=7)
    e.add_argument("--side", choices=("on", "off"), default="on", help="the service --profile records")
    e.add_argument("--profile")
    s = sub.add_parser("stalled")
    s.add_argument("--tokens", type=int, default=200)
    s.add_argument("--rounds", type=int, default=3)
    s.add_argument("--profile")
    args = parser.parse_args()
    events(args) if args.workload == "events" else stalled(args)


if __name__ == "__main__":
    main()
