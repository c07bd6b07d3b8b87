"""The concurrency sweep (issue 18), through the real server on loopback, in one run:

- scripted streams at 1, 10, 100 and 1,000 at once, on each face (`/lmsp/v1/responses`, the
  OpenAI face's `/v1/responses`), both as the streams of POSTs and as readers of tasks:
  events/s written to all clients, p50/p99 gap between a stream's events, the server's CPU time
  per event (/proc/PID/stat), the client's CPU (it shares the machine), and the server's memory
  per open stream;
- the real model at 1, 2, 4 and 8 streams, lmsp (`--parallel 8`) beside llama.cpp's own
  `llama-server -np 8` built from the same llama.cpp: aggregate tokens/s, slowest first token,
  and lmsp's scheduler time outside llama_decode as a share of its working time (/metrics);
  at 1 and 8 streams also lmsp on a native build of llama.cpp's libraries (`LLAMA_CPP_LIB_PATH`)
  beside lmsp on the installed, portable wheel: what the portable build costs (issue 37).

Every point is measured several times in the run (REPEATS, MODEL_REPEATS); a figure is their
median and its noise their spread (`figures.repeated`), which the report (bench/scripts/report.py)
weighs moves against.

The scripted backend plays one sequence at a time, so every cell starts the same way: a blocker
task holds the backend, the N streams open and queue behind it (the server holds them all, as
it would N real clients), and the clock starts when the blocker is cancelled. Connecting is not
timed; serving is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest

from figures import KEEP_LOADED, QUICK, SCRIPTED, not_measured, repeated
from llama_server import LlamaServer, ensure_llama_server, ensure_native_libs
from lmsp.engine.registry import embedded_model_path
from lmsp.testing import RunningServer, free_port, isolated_env, start_server
from model_streams import PROMPTS, Stream, engine_seconds, fan_out, host_share, llama_server_stream, lmsp_stream, render
from procstat import cpu_seconds, raise_open_files, rss_kib
from sse_client import SseStream, gaps_us

STREAMS = (1, 10, 100, 1000)
MODEL_STREAMS = (1, 2, 4, 8)
NATIVE_STREAMS = (1, 8)  # where the portable build is weighed against the native one
REPEATS = 3 if QUICK else 5
MODEL_REPEATS = 2 if QUICK else 5  # a real model's round is seconds, not a fraction of one
# Events written to all clients in one cell, whatever N (each stream gets its share): enough
# that the server's CPU time, read in 10 ms ticks, is counted to a few per cent.
EVENTS_PER_CELL = 200_000 if QUICK else 1_000_000
# A task's ring is sized to hold a whole task (sweep_server), so its readers lose nothing. A
# POST stream's ring is the default 65,536 events, and the scripted backend writes far faster
# than one Python reader reads: a lone reader more than a ring behind is ended by design (the
# "fell behind" frame), as CI once saw at 15,488 of 200,000. So a POST stream stays inside its
# ring.
MOST_PER_STREAM = {"post": 60_000, "task": 500_000}
TASKS = 10  # readers of a cell share at most this many tasks (each event goes to N / TASKS)
# Frames besides the deltas: created, item added, item done, the final one; the OpenAI face
# adds in_progress, content part added and done, and text done.
EXTRA_EVENTS = {"lmsp": 4, "openai": 8}

raise_open_files()


def _user(text: str) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}]


def _request(face: str, tokens: int, **extra: Any) -> dict[str, Any]:
    if face == "lmsp":
        return {"model": SCRIPTED, "input": _user("!repeat tok"), "max_output_tokens": tokens, **extra}
    return {"model": SCRIPTED, "input": "!repeat tok", "max_output_tokens": tokens, **extra}


async def _task_path(control: httpx.AsyncClient, face: str, tokens: int) -> str:
    """Creates a task; the path its readers follow."""
    if face == "lmsp":
        r = await control.post("/lmsp/v1/tasks", json=_request(face, tokens))
        assert r.status_code == 202, r.text
        return f"/lmsp/v1/tasks/{r.json()['id']}/events"
    r = await control.post("/v1/responses", json=_request(face, tokens, background=True))
    assert r.status_code == 200, r.text
    return f"/v1/responses/{r.json()['id']}?stream=true"


async def _streams(control: httpx.AsyncClient, port: int, face: str, kind: str, n: int, tokens: int) -> list[SseStream]:
    if kind == "post":
        path = "/lmsp/v1/responses" if face == "lmsp" else "/v1/responses"
        body = (
            _request(face, tokens, stream=True) if face == "lmsp" else _request(face, tokens, stream=True, store=False)
        )
        return [SseStream(port, "POST", path, body) for _ in range(n)]
    paths = [await _task_path(control, face, tokens) for _ in range(min(n, TASKS))]
    return [SseStream(port, "GET", paths[i % len(paths)]) for i in range(n)]


async def _cell(server: RunningServer, face: str, kind: str, n: int, tokens: int) -> dict[str, float]:
    """N streams of `tokens` deltas each, released at once; what it cost, seen from both sides."""
    pid = server.proc.pid
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as control:
        blocker = await control.post(
            "/lmsp/v1/tasks", json={"model": SCRIPTED, "input": _user("!slow 60000 a b"), "max_output_tokens": 10}
        )
        assert blocker.status_code == 202, blocker.text
        cancel = f"/lmsp/v1/tasks/{blocker.json()['id']}/cancel"
        try:
            streams = await _streams(control, server.port, face, kind, n, tokens)
            memory_before = rss_kib(pid)
            running = [asyncio.ensure_future(s.run()) for s in streams]
            opened = asyncio.ensure_future(asyncio.gather(*(s.opened.wait() for s in streams)))
            # A stream refused (429, …) ends its task before it opens: stop waiting, say why.
            await asyncio.wait([opened, *running], timeout=120, return_when=asyncio.FIRST_COMPLETED)
            if not opened.done():
                opened.cancel()
                failed = [t.exception() for t in running if t.done() and t.exception()]
                raise AssertionError(f"{sum(s.opened.is_set() for s in streams)} of {n} streams opened: {failed[:1]}")
            memory_open = rss_kib(pid)
            server_cpu, client_cpu = cpu_seconds(pid), time.process_time()
            started = time.perf_counter()
            assert (await control.post(cancel)).status_code == 200
            await asyncio.gather(*running)
            wall = time.perf_counter() - started
            server_cpu, client_cpu = cpu_seconds(pid) - server_cpu, time.process_time() - client_cpu
        finally:
            await control.post(cancel)  # a cell that failed must not leave the backend held
    expected = tokens + EXTRA_EVENTS[face]
    assert all(s.events == expected for s in streams), (
        f"a stream missed events: {[s.events for s in streams if s.events != expected][:5]}, not {expected}"
    )
    events = n * expected
    gaps = gaps_us(streams)
    # No gaps at all: every stream's events came in one read.
    p50, p99 = np.percentile(gaps, [50, 99]) if gaps else (0.0, 0.0)
    return {
        "events_per_s": events / wall,
        "p50_gap_us": float(p50),
        "p99_gap_us": float(p99),
        "server_cpu_us_per_event": server_cpu / events * 1e6,
        "client_cpu_cores": client_cpu / wall,
        "rss_kib_per_open_stream": (memory_open - memory_before) / n,
    }


async def _sweep(server: RunningServer, face: str, kind: str) -> tuple[dict[int, dict[str, list[float]]], float]:
    await _cell(server, face, kind, 10, 100)  # warm: the first of anything pays for imports
    samples: dict[int, dict[str, list[float]]] = {n: {} for n in STREAMS}
    rss_per_stream = 0.0
    for repeat in range(REPEATS):  # each round goes through every N: drift hits them alike
        for n in sorted(STREAMS, reverse=True):
            tokens = max(1, min(MOST_PER_STREAM[kind], EVENTS_PER_CELL // n) - EXTRA_EVENTS[face])
            cell = await _cell(server, face, kind, n, tokens)
            # Memory the server took for N streams is kept by its allocator once they end, so
            # only the first, largest cell on a fresh server measures it.
            if repeat == 0 and n == max(STREAMS):
                rss_per_stream = cell["rss_kib_per_open_stream"]
            for name, value in cell.items():
                samples[n].setdefault(name, []).append(value)
    return samples, rss_per_stream


@pytest.fixture
def sweep_server(tmp_path) -> Iterator[RunningServer]:
    # A queue for every stream of the largest cell (the scripted backend plays one at a time),
    # no keep-alive comment while they wait (it would count as an event), and a task ring that
    # holds a whole task (a lone reader is as fast as the backend, not faster).
    srv = start_server(
        tmp_path,
        "--scripted-model",
        SCRIPTED,
        "--max-queue",
        "2048",
        "--keepalive",
        "600",
        *KEEP_LOADED,
        "--max-output-tokens",
        str(MOST_PER_STREAM["task"]),
        "--task-events-max",
        str(MOST_PER_STREAM["task"] + 16),
        "--task-events-bytes",
        str(1 << 30),
    )
    yield srv
    srv.stop()


@pytest.mark.parametrize("kind", ["post", "task"])
@pytest.mark.parametrize("face", ["lmsp", "openai"])
def test_scripted_sweep(sweep_server, figures, face, kind):
    samples, rss_per_stream = asyncio.run(_sweep(sweep_server, face, kind))
    prefix = f"sweep.scripted.{face}.{kind}"
    for n, cell in samples.items():
        for name, values in cell.items():
            if name != "rss_kib_per_open_stream":
                repeated(figures, f"{prefix}.streams_{n}.{name}", values)
    figures[f"{prefix}.rss_kib_per_open_stream"] = rss_per_stream


def _model_round(url: str, stream: Stream, texts: list[str]) -> dict[str, float]:
    done = fan_out(stream, url, texts)
    return {"tok_per_s": done["tok_per_s"], "slowest_ttft_ms": done["slowest_ttft_s"] * 1e3}


# On an idle 2-core machine the whole test takes about a minute in quick mode; a machine that
# others are loading can make it ten times slower, which is noise, not a hang.
@pytest.mark.timeout(1800)
def test_model_sweep_vs_llama_server(tmp_path, figures):
    # A new opening for every round and N: neither server finds the prompt in its cache.
    texts = {(r, n): [f"Take {r}.{n}. {p}" for p in PROMPTS[:n]] for r in range(MODEL_REPEATS) for n in MODEL_STREAMS}
    keys = list(texts)
    rendered_all = iter(render([t for key in keys for t in texts[key]]))
    rendered = {key: [next(rendered_all) for _ in texts[key]] for key in keys}
    try:
        binary = ensure_llama_server()
        theirs: LlamaServer | None = LlamaServer(binary, embedded_model_path(), free_port(), parallel=8)  # type: ignore[arg-type]
        reason = ""
    except (OSError, RuntimeError) as exc:
        # The baseline could not be built or started here (no compiler, no network): its rows
        # say so, and the run's summary and .ci/run say it loudly (bench/scripts/not_measured.py).
        theirs, reason = None, " ".join(str(exc).split())
    try:
        native_env = isolated_env(tmp_path / "native-home", LLAMA_CPP_LIB_PATH=str(ensure_native_libs()))
        native: RunningServer | None = start_server(tmp_path, "--parallel", "8", *KEEP_LOADED, env=native_env)
        native_reason = ""
    except (OSError, RuntimeError) as exc:
        native, native_reason = None, " ".join(str(exc).split())
    ours = start_server(tmp_path, "--parallel", "8", *KEEP_LOADED)
    samples: dict[str, dict[int, dict[str, list[float]]]] = {"lmsp": {}, "llama_server_np8": {}}
    try:
        lmsp_stream(ours.url, "Hello")  # none pays for a cold start
        if theirs is not None:
            llama_server_stream(theirs.url, "Hello")
        if native is not None:
            lmsp_stream(native.url, "Hello")
        for r in range(MODEL_REPEATS):  # alternate, so that drift in the machine hits both alike
            for n in MODEL_STREAMS:
                engine = engine_seconds(ours.url)
                rounds = {"lmsp": _model_round(ours.url, lmsp_stream, texts[r, n])}
                rounds["lmsp"]["host_share"] = host_share(engine, engine_seconds(ours.url))
                if theirs is not None:
                    rounds["llama_server_np8"] = _model_round(theirs.url, llama_server_stream, rendered[r, n])
                    rounds["ratio"] = {
                        "tok_per_s": rounds["lmsp"]["tok_per_s"] / rounds["llama_server_np8"]["tok_per_s"],
                        "slowest_ttft": rounds["lmsp"]["slowest_ttft_ms"]
                        / rounds["llama_server_np8"]["slowest_ttft_ms"],
                    }
                if native is not None and n in NATIVE_STREAMS:
                    rounds["lmsp_native"] = _model_round(native.url, lmsp_stream, [f"Native {t}" for t in texts[r, n]])
                    rounds["portable_vs_native"] = {
                        "tok_per_s": rounds["lmsp"]["tok_per_s"] / rounds["lmsp_native"]["tok_per_s"]
                    }
                for server, got in rounds.items():
                    for name, value in got.items():
                        samples.setdefault(server, {}).setdefault(n, {}).setdefault(name, []).append(value)
    finally:
        ours.stop()
        if theirs is not None:
            theirs.stop()
        if native is not None:
            native.stop()
    for n in MODEL_STREAMS:
        for server in ("lmsp", "llama_server_np8"):
            for name in ("tok_per_s", "slowest_ttft_ms"):
                key = f"sweep.model.{server}.streams_{n}.{name}"
                if server in samples and n in samples[server]:
                    repeated(figures, key, samples[server][n][name])
                else:
                    figures[key] = not_measured(reason)
        repeated(figures, f"sweep.model.lmsp.streams_{n}.host_share", samples["lmsp"][n]["host_share"])
    for n in NATIVE_STREAMS:
        for server in ("lmsp_native", "portable_vs_native"):
            key = f"sweep.model.{server}.streams_{n}.tok_per_s" + ("_ratio" if server == "portable_vs_native" else "")
            if server in samples:
                repeated(figures, key, samples[server][n]["tok_per_s"])
            else:
                figures[key] = not_measured(native_reason)
    for n in MODEL_STREAMS:
        for name in ("tok_per_s", "slowest_ttft"):  # a ratio per round, then their median
            key = f"sweep.model.lmsp_vs_llama_server.streams_{n}.{name}_ratio"
            if "ratio" in samples:
                repeated(figures, key, samples["ratio"][n][name])
            else:
                figures[key] = not_measured(reason)
