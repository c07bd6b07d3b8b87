"""The EventLog ring from Python: per-token append through the binding at the ring's
bounds, and replay (`frames_after`, one `bytes` per catch-up). The Rust-only figures come
from `cargo bench -p lmsp-events`; these add the cost of crossing PyO3."""

from __future__ import annotations

from figures import QUICK
from lmsp._core import EventLog

N = 20_000 if QUICK else 200_000
NAME = "response.output_text.delta"
HEAD = b'{"response_id":"resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF","item_id":"msg_01J8M6Q4W5C8H2K9P3S7Y1A6ZE","delta":'
KEPT = 4_096 if QUICK else 65_536


def full_log() -> EventLog:
    """A log past its count bound, so that every append also drops the oldest event."""
    log = EventLog(max_events=KEPT)
    for _ in range(KEPT + 1):
        log.append_text(NAME, HEAD, " local", b"}")
    return log


def test_ring_append_text(benchmark, figures):
    benchmark.group = "ring"
    log = full_log()
    append = log.append_text

    def run() -> None:
        for _ in range(N):
            append(NAME, HEAD, " local", b"}")

    benchmark.pedantic(run, rounds=3 if QUICK else 7, iterations=1, warmup_rounds=1)
    assert log.last_id - log.first_id + 1 == KEPT
    figures["ring.python.append_text.events_per_s"] = N / benchmark.stats.stats.min


def test_ring_replay_frames_after(benchmark, figures):
    benchmark.group = "ring"
    log = full_log()
    after = log.first_id - 1
    passes = max(1, N // KEPT)

    def run() -> None:
        for _ in range(passes):
            log.frames_after(after)

    benchmark.pedantic(run, rounds=3 if QUICK else 7, iterations=1, warmup_rounds=1)
    figures["ring.python.replay_frames_after.events_per_s"] = passes * KEPT / benchmark.stats.stats.min
