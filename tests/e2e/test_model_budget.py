"""Issue 28, models: `--max-loaded-bytes` bounds the loaded models' memory (each estimated from
its GGUF: weights + KV cache), beside the count; and a load re-confines the file discovery
found. A real server on copies of the embedded GGUF in a --model-dir, with a budget that holds
one of them but not two, and no count bound."""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import assert_problem, body, read_until, send_post
from lmsp.engine.footprint import estimate_bytes
from lmsp.testing import RunningServer, isolated_env, start_server
from model_stores import embedded

A, B, HUGE, LINKED = "smol:a-q4_1", "smol:b-q4_1", "smol:huge-q4_1", "smol:linked-q4_1"
CTX = 1024
WAIT = 3.0
LONG = {"max_output_tokens": 3000, "temperature": 0}


def _budget() -> int:
    """Room for one copy of the embedded model, not two."""
    return estimate_bytes(embedded(), ctx_per_sequence=CTX, n_parallel=1) * 3 // 2


@pytest.fixture(scope="module")
def budget(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    work = tmp_path_factory.mktemp("budget")
    folder = work / "models"
    (folder / "blobs").mkdir(parents=True)
    for name in ("Smol-A.Q4_1.gguf", "Smol-B.Q4_1.gguf"):
        shutil.copyfile(embedded(), folder / name)
    # Its header (the shape the estimate reads) and a size past the budget, sparse: never loaded.
    with embedded().open("rb") as src, (folder / "Smol-Huge.Q4_1.gguf").open("wb") as dst:
        dst.write(src.read(4 << 20))
        dst.truncate(_budget() + (1 << 20))
    # A link the user made, to a file in the folder that is no model of its own (not *.gguf).
    (folder / "blobs" / "linked.bin").write_bytes(embedded().read_bytes()[: 4 << 20])
    os.symlink("blobs/linked.bin", folder / "Smol-Linked.Q4_1.gguf")
    env = isolated_env(work / "home", LMSP_MODEL_DIRS=str(folder), LMSP_NO_DISCOVER="1")
    srv = start_server(
        work,
        *("--parallel", "1", "--ctx-size", str(CTX), "--max-loaded", "0"),
        *("--max-loaded-bytes", str(_budget()), "--min-residency", "0", "--load-wait", str(WAIT)),
        env=env,
    )
    yield srv, folder
    srv.stop()


def _loads(srv: RunningServer) -> dict[str, float]:
    text = httpx.get(f"{srv.url}/metrics", timeout=30).text
    return {
        s.labels["model"]: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "lmsp_model_loads_total"
    }


def _most_resident(srv: RunningServer) -> int:
    """The most models taking memory at once, from the start of a load to the end of its
    unload (or its failure), by the log's lines in order."""
    now = most = 0
    for line in srv.log_path.read_text().splitlines():
        if re.match(r"lmsp: loading \S+ from ", line):
            now += 1
            most = max(most, now)
        elif re.match(r"lmsp: (unloaded \S+$|loading \S+ failed: )", line):
            now -= 1
    return most


def test_a_model_past_the_budget_alone_is_refused_at_once(budget):
    srv, _ = budget
    started = time.monotonic()
    r = httpx.post(f"{srv.url}/lmsp/v1/responses", json=body("Hi", model=HUGE, max_output_tokens=2), timeout=30)
    took = time.monotonic() - started
    doc = assert_problem(r, 503, "model_unavailable")
    assert "--max-loaded-bytes" in doc["detail"] and "MiB" in doc["detail"], doc
    assert "retry-after" not in r.headers  # waiting would not help
    assert took < WAIT, took  # not a wait for room that never comes
    assert f"lmsp: loading {HUGE}" not in srv.log_path.read_text()


def test_an_idle_model_makes_room_by_bytes(budget):
    srv, _ = budget
    url = f"{srv.url}/lmsp/v1/responses"
    for model in (A, B):
        r = httpx.post(url, json=body("Hi", model=model, max_output_tokens=2), timeout=60)
        assert r.status_code == 200, r.text
    # Two copies never share the budget: B's load waited for A's unload.
    assert _most_resident(srv) == 1
    assert _loads(srv) == {A: 1, B: 1}


def test_a_waiter_for_bytes_gets_503_by_its_deadline(budget):
    srv, _ = budget
    with socket.create_connection(("127.0.0.1", srv.port)) as holder:
        send_post(holder, {**body("Write a very long essay about rivers.", model=B, **LONG), "stream": True})
        read_until(holder, b"output_text.delta")  # B is loaded and busy: no bytes left for A
        started = time.monotonic()
        r = httpx.post(f"{srv.url}/lmsp/v1/responses", json=body("Hi", model=A, max_output_tokens=2), timeout=30)
        took = time.monotonic() - started
        doc = assert_problem(r, 503, "model_unavailable")
        assert "--max-loaded-bytes" in doc["detail"], doc
        assert int(r.headers["retry-after"]) >= 1
        assert WAIT - 0.1 <= took < WAIT + 5, took
    assert _most_resident(srv) == 1


def test_a_link_repointed_outside_after_discovery_is_refused(budget, tmp_path):
    srv, folder = budget
    # A valid model outside the folder: without the re-confinement it would load.
    outside = tmp_path / "Other.gguf"
    os.symlink(embedded(), outside)
    link = folder / "Smol-Linked.Q4_1.gguf"
    link.unlink()
    os.symlink(outside, link)
    r = httpx.post(f"{srv.url}/lmsp/v1/responses", json=body("Hi", model=LINKED, max_output_tokens=2), timeout=60)
    doc = assert_problem(r, 503, "model_unavailable")
    assert "leads elsewhere" in doc["detail"], doc
    assert os.sep not in doc["detail"], "a client learns no path of the service's"
    assert f"lmsp: loaded {LINKED}" not in srv.log_path.read_text()


# --- a budget smaller than the embedded model -------------------------------------------------

EMBEDDED = "smollm2:135m-instruct-q4_1"
TINY = "50M"


def test_a_tiny_budget_refuses_the_real_model_at_once_and_serves_on(tmp_path):
    # The embedded model alone: preloaded by default, but not past the budget (it would be
    # refused on first use all the same), so the service starts and answers at once.
    srv = start_server(tmp_path, "--no-discover", "--max-loaded-bytes", TINY, env=isolated_env(tmp_path / "home"))
    try:
        for _ in range(2):
            started = time.monotonic()
            r = httpx.post(f"{srv.url}/lmsp/v1/responses", json=body("Hi", model=EMBEDDED), timeout=30)
            took = time.monotonic() - started
            doc = assert_problem(r, 503, "model_unavailable")
            assert "more than --max-loaded-bytes (50 MiB)" in doc["detail"], doc
            assert took < 2, took
        assert httpx.get(f"{srv.url}/lmsp/v1/models", timeout=30).json()["data"][0]["loaded"] is False
        assert "lmsp: loading " not in srv.log_path.read_text()
    finally:
        srv.stop()


def test_a_preload_past_the_budget_stops_serve_saying_why(tmp_path):
    with pytest.raises(RuntimeError, match=r"--preload smollm2:135m-instruct-q4_1: .*--max-loaded-bytes \(50 MiB\)"):
        start_server(
            tmp_path,
            *("--no-discover", "--preload", EMBEDDED, "--max-loaded-bytes", TINY),
            env=isolated_env(tmp_path / "home"),
        )
