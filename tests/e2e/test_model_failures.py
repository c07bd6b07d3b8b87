"""Issue 28, models: a model that failed to load answers its error at once for
`--failed-load-ttl`, with a Retry-After, instead of reading its file again per request; after
that a load is tried again. A real server on a copy of the embedded GGUF in a --model-dir,
broken after discovery found it."""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from helpers import assert_problem, body, read_until, send_post
from lmsp.testing import RunningServer, isolated_env, start_server
from model_stores import embedded

MODEL_ID = "smol:a-q4_1"
TTL = 3.0


@pytest.fixture(scope="module")
def broken(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Path]]:
    work = tmp_path_factory.mktemp("failed-load")
    folder = work / "models"
    folder.mkdir()
    gguf = folder / "Smol-A.Q4_1.gguf"
    shutil.copyfile(embedded(), gguf)
    env = isolated_env(work / "home", LMSP_MODEL_DIRS=str(folder), LMSP_NO_DISCOVER="1")
    srv = start_server(work, "--parallel", "1", "--ctx-size", "1024", "--failed-load-ttl", str(TTL), env=env)
    yield srv, gguf
    srv.stop()


def _loads(srv: RunningServer) -> int:
    return srv.log_path.read_text().count(f"lmsp: loading {MODEL_ID} from ")


def test_a_failed_load_is_remembered_then_tried_again(broken):
    srv, gguf = broken
    good = gguf.read_bytes()
    gguf.write_bytes(b"not a GGUF file at all" * 64)  # broken after discovery found it
    hi = body("Hi", model=MODEL_ID, max_output_tokens=2)
    with httpx.Client(base_url=srv.url, timeout=60) as c:
        first = c.post("/lmsp/v1/responses", json=hi)
        failed_at = time.monotonic()
        doc = assert_problem(first, 503, "model_unavailable")
        assert "could not be loaded" in doc["detail"]
        assert str(gguf.parent) not in doc["detail"], "a client learns no path of the service's"
        assert _loads(srv) == 1
        gguf.write_bytes(good)  # mended: a load would work now, but the failure is remembered
        again = c.post("/lmsp/v1/responses", json=hi)
        assert_problem(again, 503, "model_unavailable")
        assert 1 <= int(again.headers["retry-after"]) <= TTL
        assert _loads(srv) == 1, "loaded again within --failed-load-ttl"
        time.sleep(max(0.0, failed_at + TTL + 0.2 - time.monotonic()))
        ok = c.post("/lmsp/v1/responses", json=hi)
        assert ok.status_code == 200, ok.text
        assert _loads(srv) == 2


# --- waiting for room to load ---------------------------------------------------------------

A, B = "smol:a-q4_1", "smol:b-q4_1"
WAIT = 3.0
LONG = {"max_output_tokens": 3000, "temperature": 0}


def _two_models(tmp_path_factory: pytest.TempPathFactory, name: str, *args: str) -> RunningServer:
    """A server of two copies of the embedded model (A and B), one loaded at a time."""
    work = tmp_path_factory.mktemp(name)
    folder = work / "models"
    folder.mkdir()
    for file in ("Smol-A.Q4_1.gguf", "Smol-B.Q4_1.gguf"):
        shutil.copyfile(embedded(), folder / file)
    env = isolated_env(work / "home", LMSP_MODEL_DIRS=str(folder), LMSP_NO_DISCOVER="1")
    return start_server(work, "--parallel", "1", "--ctx-size", "1024", "--max-loaded", "1", *args, env=env)


@pytest.fixture(scope="module")
def one_room(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Two copies of the embedded model, one loaded at a time, a request waiting WAIT s for room
    (and no minimum residency: what these tests wait for is the model in use)."""
    srv = _two_models(tmp_path_factory, "one-room", "--load-wait", str(WAIT), "--min-residency", "0")
    yield srv
    srv.stop()


def test_a_waiter_for_room_gets_503_by_its_deadline(one_room):
    with socket.create_connection(("127.0.0.1", one_room.port)) as holder:
        send_post(holder, {**body("Write a very long essay about rivers.", model=A, **LONG), "stream": True})
        read_until(holder, b"output_text.delta")  # A is loaded and busy: no room for B
        started = time.monotonic()
        r = httpx.post(f"{one_room.url}/lmsp/v1/responses", json=body("Hi", model=B, max_output_tokens=2), timeout=30)
        took = time.monotonic() - started
        doc = assert_problem(r, 503, "model_unavailable")
        assert "--max-loaded" in doc["detail"]
        assert int(r.headers["retry-after"]) >= 1
        assert WAIT - 0.1 <= took < WAIT + 5, took  # before: it waited for as long as A was busy
    # A let go (its client left): B takes its room.
    r = httpx.post(f"{one_room.url}/lmsp/v1/responses", json=body("Hi", model=B, max_output_tokens=2), timeout=60)
    assert r.status_code == 200, r.text


def test_waiters_for_room_each_get_it_in_turn(one_room):
    url = f"{one_room.url}/lmsp/v1/responses"
    with socket.create_connection(("127.0.0.1", one_room.port)) as holder:
        send_post(holder, {**body("Write a very long essay about lakes.", model=B, **LONG), "stream": True})
        read_until(holder, b"output_text.delta")
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(httpx.post, url, json=body("Hi", model=A, max_output_tokens=2), timeout=30)
            time.sleep(0.2)  # queued behind the first
            second = pool.submit(httpx.post, url, json=body("Hi", model=A, max_output_tokens=2), timeout=30)
            time.sleep(0.3)
            holder.close()  # B is let go within WAIT: both waiters are served
            assert first.result().status_code == 200, first.result().text
            assert second.result().status_code == 200, second.result().text


# --- minimum residency --------------------------------------------------------------------

RESIDENCY = 4.0


@pytest.fixture(scope="module")
def settling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """As `one_room`, with a minimum residency of RESIDENCY s before an idle model makes room."""
    srv = _two_models(
        tmp_path_factory, "settling", "--keep-alive", "-1", "--min-residency", str(RESIDENCY), "--load-wait", "30"
    )
    yield srv
    srv.stop()


def test_an_idle_model_stays_its_minimum_residency_before_it_makes_room(settling):
    url = f"{settling.url}/lmsp/v1/responses"
    # A's residency starts when it loads, after this: B's answer, which waits for the rest of
    # it, cannot come sooner than RESIDENCY from here, however slow A's load on a busy machine.
    started = time.monotonic()
    assert httpx.post(url, json=body("Hi", model=A, max_output_tokens=2), timeout=60).status_code == 200
    # A is idle at once, but loaded moments ago (two tokens before its answer): B waits for the
    # rest of A's residency, then takes its room. Before, B evicted A at once (~1-2 s here).
    r = httpx.post(url, json=body("Hi", model=B, max_output_tokens=2), timeout=60)
    assert r.status_code == 200, r.text
    assert time.monotonic() - started >= RESIDENCY - 0.5, "A was unloaded before its minimum residency"
    log = settling.log_path.read_text()
    assert log.count(f"lmsp: loading {A} from ") == 1 and log.count(f"lmsp: loading {B} from ") == 1


def test_a_stream_whose_client_left_before_its_model_loaded_loads_nothing(one_room):
    loads = one_room.log_path.read_text().count(f"lmsp: loading {B} from ")
    with socket.create_connection(("127.0.0.1", one_room.port)) as holder:
        send_post(holder, {**body("Write a very long essay about seas.", model=A, **LONG), "stream": True})
        read_until(holder, b"output_text.delta")  # A loaded and busy: B must wait for room
        with socket.create_connection(("127.0.0.1", one_room.port)) as gone:
            send_post(gone, {**body("Hi", model=B, max_output_tokens=2), "stream": True})
            read_until(gone, b"event: response.created")
        time.sleep(WAIT - 1.0)  # its disconnect is noticed (a keep-alive a second), within its wait
    # A is idle now: a waiter still there would unload it and load B (before: it did).
    time.sleep(1.5)
    assert one_room.log_path.read_text().count(f"lmsp: loading {B} from ") == loads
