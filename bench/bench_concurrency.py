"""A lone stream on a server configured for 8 slots vs. the same stream on 1: what the slots
cost a client that has the model to itself. (Many streams at once, against llama.cpp's own
llama-server, are in the sweep: bench_sweep.py.)"""

from __future__ import annotations

from lmsp.testing import start_server

from conftest import KEEP_LOADED, QUICK
from model_streams import PROMPTS, fan_out, lmsp_stream


def test_lone_stream_on_eight_slots_vs_one(tmp_path, figures):
    rates = {}
    for parallel in (1, 8):
        srv = start_server(tmp_path, "--parallel", str(parallel), *KEEP_LOADED)
        try:
            lmsp_stream(srv.url, "Hello")
            runs = [fan_out(lmsp_stream, srv.url, [p])["tok_per_s"] for p in PROMPTS[: 2 if QUICK else 4]]
        finally:
            srv.stop()
        rates[parallel] = sum(runs) / len(runs)
    figures["concurrency.lone_stream_1_slot.tok_per_s"] = rates[1]
    figures["concurrency.lone_stream_8_slots.tok_per_s"] = rates[8]
    figures["concurrency.lone_stream_8_vs_1_slot.ratio"] = rates[8] / rates[1]
