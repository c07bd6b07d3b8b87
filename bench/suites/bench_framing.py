"""Framing one `response.output_text.delta` event: Rust (`lmsp._core`) vs. Python + orjson.

The Python baseline is the best pure-Python frame we know: orjson for the data and one bytes
%-format for the SSE lines. The Rust paths are the ones the service uses.
"""

from __future__ import annotations

import orjson
import pytest

from figures import QUICK
from lmsp._core import EventLog, encode_frame

N = 20_000 if QUICK else 200_000
NAME = "response.output_text.delta"
RID = "resp_01J8M6Q4W2T7N5R3V9X1Z8B0DF"
IID = "msg_01J8M6Q4W5C8H2K9P3S7Y1A6ZE"
DELTA = " local"
HEAD = orjson.dumps({"response_id": RID, "item_id": IID})[:-1] + b',"delta":'


def python_orjson_frames() -> None:
    for i in range(N):
        data = orjson.dumps({"response_id": RID, "item_id": IID, "delta": DELTA})
        _ = b"id: %d\nevent: %s\ndata: %s\n\n" % (i, b"response.output_text.delta", data)


def core_encode_frames() -> None:
    for i in range(N):
        encode_frame(i, NAME, orjson.dumps({"response_id": RID, "item_id": IID, "delta": DELTA}))


def core_log_append_text() -> None:
    log = EventLog()
    append = log.append_text
    for _ in range(N):
        append(NAME, HEAD, DELTA, b"}")


def test_frames_match():
    """All three build the same bytes, so the timings compare like with like."""
    data = orjson.dumps({"response_id": RID, "item_id": IID, "delta": DELTA})
    expected = b"id: 1\nevent: %s\ndata: %s\n\n" % (NAME.encode(), data)
    assert encode_frame(1, NAME, data) == expected
    log = EventLog()
    log.append_text(NAME, HEAD, DELTA, b"}")
    assert log.frames_after(0) == (1, expected)


@pytest.mark.parametrize(
    "impl",
    [python_orjson_frames, core_encode_frames, core_log_append_text],
    ids=["python_orjson", "core_encode_frame", "core_log_append_text"],
)
def test_framing(benchmark, figures, impl):
    benchmark.group = "framing"
    benchmark.pedantic(impl, rounds=5 if QUICK else 10, iterations=1, warmup_rounds=1)
    ns = benchmark.stats.stats.min / N * 1e9
    figures[f"framing.{impl.__name__}.ns_per_event"] = ns
    base = figures.get("framing.python_orjson_frames.ns_per_event")
    if base and impl is not python_orjson_frames:
        figures[f"framing.{impl.__name__}.speedup_vs_python"] = base / ns
