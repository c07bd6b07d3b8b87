"""Models load on their first request and unload when idle (`--keep-alive`), and at most
`--max-loaded` are loaded at once: real servers on copies of the embedded model, found in
model stores built under a temporary HOME."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pexpect
import pytest

from helpers import KEEPALIVE, MODEL, body, checked_client
from lmsp.client import iter_events
from lmsp.engine.registry import ModelEntry
from lmsp.engine.scheduler import SchedulerConfig
from lmsp.service.models import ModelManager
from lmsp.testing import RunningServer, free_port, isolated_env, start_server, worker_threads
from model_stores import embedded, hub_repo, lmstudio_model, ollama_model, real_split

OLLAMA = "smol-ollama:q4_1"
SPLIT = "hf.co/HuggingFaceTB/Smol-Split-GGUF:Q4_1"  # two shards in the Hugging Face cache
STUDIO = "smol:studio-q4_1"
A, B = "smol:a-q4_1", "smol:b-q4_1"
SMALL = ("--parallel", "1", "--ctx-size", "1024")
# An answer that cannot end before its client hangs up: a JSON array of 4,000 numbers is
# longer than any max_output_tokens accepted here, and the grammar allows no end of text.
ENDLESS = {
    "max_output_tokens": 900,
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "many", "schema": {"type": "array", "items": {"type": "integer"}, "minItems": 4000}},
    },
}


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's HOME with a model in Ollama's store, a split one in the Hugging Face cache and
    one in LM Studio's folder: each its own copy of the embedded GGUF."""
    root = tmp_path_factory.mktemp("stores")
    home = root / "home"
    ollama_model(home / ".ollama" / "models", "smol-ollama", "q4_1", embedded())
    shards = real_split(embedded(), root / "split", "Smol-Split-Q4_1")
    hub_repo(home / ".cache" / "huggingface" / "hub", "HuggingFaceTB", "Smol-Split-GGUF", {s.name: s for s in shards})
    lmstudio_model(
        home / ".lmstudio" / "models", "lmstudio-community", "Smol-GGUF", {"Smol-Studio.Q4_1.gguf": embedded()}
    )
    return home


@pytest.fixture(scope="module")
def lazy(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Every store discovered; nothing preloaded (there are several models); idle models
    unloaded at once."""
    srv = start_server(tmp_path_factory.mktemp("lazy"), *SMALL, "--keep-alive", "0", env=isolated_env(home))
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def swapping(home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Two copies in two --model-dir folders, one model loaded at a time, set through the
    environment; `--keep-alive -1` given as a flag beside LMSP_KEEP_ALIVE=0 (the flag wins)."""
    work = tmp_path_factory.mktemp("swapping")
    dirs = [work / "a", work / "b"]
    for folder, name in zip(dirs, ("Smol-A.Q4_1.gguf", "Smol-B.Q4_1.gguf"), strict=True):
        folder.mkdir()
        shutil.copyfile(embedded(), folder / name)
    env = isolated_env(
        home,
        LMSP_MODEL_DIRS=os.pathsep.join(map(str, dirs)),
        LMSP_NO_DISCOVER="1",
        LMSP_MAX_LOADED="1",
        LMSP_KEEP_ALIVE="0",
        LMSP_MIN_RESIDENCY="0",  # these tests swap on every request, on purpose
        LMSP_PRELOAD=A,
    )
    srv = start_server(work, *SMALL, "--keep-alive", "-1", "--keepalive", "0.2", env=env)
    yield srv
    srv.stop()


def _models(srv: RunningServer) -> dict[str, dict[str, object]]:
    with checked_client(srv.url) as c:
        return {m["id"]: m for m in c.get("/lmsp/v1/models").json()["data"]}


def _rss(srv: RunningServer) -> int:
    for line in Path(f"/proc/{srv.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _until(check, what: str, limit: float = 120) -> None:  # type: ignore[no-untyped-def]
    """Polls `check` (a guard against a hang, not a time asserted)."""
    deadline = time.monotonic() + limit
    while not check():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.05)


def _loads(srv: RunningServer, model_id: str) -> int:
    return srv.log_path.read_text().count(f"lmsp: loading {model_id} from ")


@contextmanager
def _held(srv: RunningServer, model_id: str) -> Iterator[None]:
    """A stream on `model_id` that is generating until the block ends (then its client hangs
    up and the service cancels it): the model is busy for exactly that long."""
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        with c.stream(
            "POST", "/lmsp/v1/responses", json={**body("Numbers.", model=model_id), **ENDLESS, "stream": True}
        ) as r:
            assert r.status_code == 200
            seen = b""
            chunks = r.iter_raw()
            while b"response.output_text.delta" not in seen:
                seen += next(chunks, b"") or pytest.fail(f"the stream ended: {seen!r}")
            yield


def _answer(srv: RunningServer, model_id: str) -> str:
    with checked_client(srv.url) as c:
        r = c.post("/lmsp/v1/responses", json=body("Say hi.", model=model_id, max_output_tokens=4))
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


def test_every_store_s_model_is_served_and_says_where_it_came_from(lazy):
    models = _models(lazy)
    assert {i: m["source"] for i, m in models.items()} == {
        MODEL: "embedded",
        OLLAMA: "ollama",
        SPLIT: "huggingface",
        STUDIO: "lmstudio",
    }
    assert not any(m["loaded"] for m in models.values())  # several models: none preloaded
    with checked_client(lazy.url) as c:  # an id with slashes is one path parameter
        assert c.get(f"/lmsp/v1/models/{SPLIT}").json() == models[SPLIT]
        assert c.get(f"/v1/models/{SPLIT}").json()["id"] == SPLIT


def test_a_request_loads_its_model_and_idle_unload_frees_it(lazy):
    before = _rss(lazy)
    with _held(lazy, SPLIT):
        assert _models(lazy)[SPLIT]["loaded"] is True
        loaded = _rss(lazy)
    # --keep-alive 0: unloaded as soon as its last request ended.
    _until(lambda: _models(lazy)[SPLIT]["loaded"] is False, "the split model unloaded")
    after = _rss(lazy)
    weights = sum(p.stat().st_size for p in embedded().parent.glob(embedded().name))
    assert loaded - before > weights // 2  # its weights were in memory…
    assert loaded - after > weights // 2  # …and are no more
    assert _answer(lazy, SPLIT) in ("completed", "incomplete")  # loaded again on demand


def test_preload_loads_at_start(swapping):
    log = swapping.log_path.read_text()
    # Listed as loading when it starts serving, loaded after (start_server waited for it).
    listed = next(line for line in log.splitlines() if line.startswith(f"  model {A} ("))
    assert listed.endswith(", loading)") and log.index(listed) < log.index(f"lmsp: loaded {A} in ")
    models = _models(swapping)
    assert sorted(models) == sorted([MODEL, A, B])  # LMSP_NO_DISCOVER: no store's model
    assert models[A]["loaded"] is True and models[B]["loaded"] is False


def test_requests_that_arrive_while_it_loads_wait_for_the_one_load(swapping):
    loads = _loads(swapping, B)
    with ThreadPoolExecutor(4) as pool:
        statuses = list(pool.map(lambda _: _answer(swapping, B), range(4)))
    assert all(s in ("completed", "incomplete") for s in statuses)
    assert _loads(swapping, B) == loads + 1


def test_a_stream_waiting_for_its_model_gets_created_at_once_and_keep_alives(swapping):  # covers: R6.3-5
    _answer(swapping, A)  # A is the one model loaded
    a = ExitStack()
    a.enter_context(_held(swapping, A))
    try:
        with httpx.Client(base_url=swapping.url, timeout=120) as c:
            with c.stream(
                "POST", "/lmsp/v1/responses", json={**body("Say hi.", model=B, max_output_tokens=4), "stream": True}
            ) as r:
                assert r.status_code == 200
                chunks = r.iter_raw()
                head = b""
                while KEEPALIVE not in head:  # B cannot load while A is busy: the stream waits
                    head += next(chunks)
                assert _models(swapping)[B]["loaded"] is False
                a.close()  # A's client hangs up: A is idle, and B takes its place
                rest = b"".join(chunks)
    finally:
        a.close()
    waiting = head.split(KEEPALIVE)[0]
    assert waiting.startswith(b"id: 1\nevent: response.created\n") and waiting.count(b"event:") == 1
    events = [(e.id, e.event) for e in iter_events([head + rest])]
    assert events[0] == ("1", "response.created")
    assert events[-1][1] in ("response.completed", "response.incomplete")
    assert [i for i, _ in events] == [str(n) for n in range(1, len(events) + 1)]


def test_max_loaded_1_swaps_two_models_under_alternating_requests(swapping):
    assert [_answer(swapping, m) in ("completed", "incomplete") for m in (A, B, A)] == [True] * 3
    with ThreadPoolExecutor(4) as pool:  # at once: each waits until the other model is idle
        statuses = list(pool.map(lambda m: _answer(swapping, m), (B, A, B, A)))
    assert all(s in ("completed", "incomplete") for s in statuses), statuses
    [last] = [m for m, d in _models(swapping).items() if d["loaded"] and m in (A, B)]
    # --keep-alive -1: it stays. With LMSP_KEEP_ALIVE=0, which the flag overrides, it would be
    # unloaded within moments of its last request.
    time.sleep(2)
    assert _models(swapping)[last]["loaded"] is True


def test_a_positive_keep_alive_runs_out(tmp_path):
    """In-process: the manager on the loop, as the service runs it."""
    path = tmp_path / "model.gguf"
    shutil.copyfile(embedded(), path)
    models = ModelManager(
        [ModelEntry("m", path)],
        SchedulerConfig(n_parallel=1, ctx_per_sequence=256, n_threads=worker_threads()),
        keep_alive=0.2,
    )

    async def use() -> None:
        backend = await models.get("m")
        assert backend.alive and models.describe("m")["loaded"] is True
        while models.describe("m")["loaded"]:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)  # the unload runs on a worker thread

    try:
        asyncio.run(asyncio.wait_for(use(), 120))
    finally:
        models.close()


def test_serve_draws_a_bar_for_the_models_it_preloads(tmp_path):
    child = pexpect.spawn(
        sys.executable,
        ["-m", "lmsp", "serve", "--port", str(free_port()), *SMALL, "--no-discover"],
        env={**isolated_env(tmp_path), "LMSP_HOME": str(tmp_path / "data")},
        timeout=120,
    )
    try:
        child.expect("lmsp listening")  # at once: the model loads as it serves
        child.expect(f"model {MODEL} \\(embedded, llama.cpp, \\w+, loading\\)")
        child.expect(rf"loading {MODEL} \[#+\] 100%")
    finally:
        child.terminate(force=True)


def test_preload_names_models_it_serves_and_that_fit(tmp_path):
    shutil.copyfile(embedded(), tmp_path / "Smol-A.Q4_1.gguf")

    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "lmsp", "serve", "--port", str(free_port()), "--no-discover", *args]
        env = {**isolated_env(tmp_path), "LMSP_HOME": str(tmp_path / "data")}
        return subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)

    unknown = serve("--preload", "nope:1b")
    assert unknown.returncode == 1 and "--preload nope:1b: no such model" in unknown.stderr
    too_many = serve("--model-dir", str(tmp_path), "--preload", MODEL, "--preload", A, "--max-loaded", "1")
    assert too_many.returncode == 1 and "more than --max-loaded 1" in too_many.stderr
