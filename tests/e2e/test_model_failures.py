"""Issue 28, models: a model that failed to load answers its error at once for
`--failed-load-ttl`, with a Retry-After, instead of reading its file again per request; after
that a load is tried again. A real server on a copy of the embedded GGUF in a --model-dir,
broken after discovery found it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers import assert_problem, body
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
