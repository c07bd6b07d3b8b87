"""The models a service preloads load as it serves (issue 40): `/ready` answers 503 `loading`
until they have, `/health` 200 all along; a request for one waits for its load, other work is
served meanwhile; a SIGTERM during the load drains as at any time; a preload llama.cpp refuses
stops the service, saying why. The load is held open by a hook in the child (sitecustomize)
until the test lets it go, so the window is not a race against a fast load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import MODEL, SCRIPTED, body
from lmsp.testing import RunningServer, free_port, isolated_env, start_server

URL = "/lmsp/v1/responses"

# The first load in `lmsp serve` waits for the file GATE to exist.
HOOK = """
import os
import sys
import time

if sys.orig_argv[1:4] == ["-m", "lmsp", "serve"]:
    from lmsp.service import models

    opened = models.ModelManager._open

    def gated_open(self, model, progress):
        while not os.path.exists(GATE):
            time.sleep(0.01)
        return opened(self, model, progress)

    models.ModelManager._open = gated_open
"""


@pytest.fixture()
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A file whose creation lets the server's model load go on."""
    hook = tmp_path / "hook"
    hook.mkdir()
    gate = tmp_path / "gate"
    (hook / "sitecustomize.py").write_text(f"GATE = {str(gate)!r}\n{HOOK}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    return gate


def _ready(url: str) -> tuple[int, dict[str, Any]]:
    started = time.monotonic()
    r = httpx.get(f"{url}/ready", timeout=10)
    assert time.monotonic() - started < 2  # read at once, not behind the load
    return r.status_code, r.json()


def _until_ready(url: str, limit: float = 60) -> None:
    deadline = time.monotonic() + limit
    while _ready(url)[0] != 200:
        assert time.monotonic() < deadline, "never ready"
        time.sleep(0.05)


def _post(url: str, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{URL}", json=payload, timeout=120)


def _waiting(pool: ThreadPoolExecutor, srv: RunningServer) -> Future[httpx.Response]:
    """A request for the model being loaded: it is held until the load ends."""
    waiting = pool.submit(_post, srv.url, body("Say hi.", max_output_tokens=4))
    time.sleep(0.5)
    assert not waiting.done()
    return waiting


def test_ready_says_loading_until_the_preload_has_loaded(tmp_path: Path, gate: Path) -> None:
    # The embedded model alone: preloaded by default.
    srv = start_server(tmp_path, "--scripted-model", SCRIPTED, loaded=False)
    try:
        assert _ready(srv.url) == (503, {"status": "not_ready", "reasons": ["loading"]})
        assert httpx.get(f"{srv.url}/health", timeout=10).json() == {"status": "ok"}
        models = httpx.get(f"{srv.url}/lmsp/v1/models", timeout=10).json()["data"]
        assert {m["id"]: m["loaded"] for m in models} == {MODEL: False, SCRIPTED: True}
        assert _post(srv.url, body("Hello there", model=SCRIPTED)).status_code == 200  # other models serve
        with ThreadPoolExecutor(1) as pool:
            waiting = _waiting(pool, srv)
            assert _ready(srv.url)[0] == 503
            gate.touch()
            answered = waiting.result(timeout=60)
        assert answered.status_code == 200 and answered.json()["status"] in ("completed", "incomplete")
        _until_ready(srv.url)
        assert _ready(srv.url) == (200, {"status": "ready"})
        log = srv.log_path.read_text()
        assert f"  model {MODEL} (embedded, llama.cpp, " in log and ", loading)\n" in log
        assert log.count(f"lmsp: loading {MODEL} from ") == 1  # the request waited for the preload
    finally:
        srv.stop()


def test_a_sigterm_while_it_loads_drains_and_exits_cleanly(tmp_path: Path, gate: Path) -> None:
    srv = start_server(tmp_path, "--drain-timeout", "60", loaded=False)
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = _waiting(pool, srv)
            srv.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while (doc := _ready(srv.url)[1])["reasons"] != ["draining", "loading"]:
                assert time.monotonic() < deadline, doc
                time.sleep(0.05)
            gate.touch()
            answered = waiting.result(timeout=60)  # admitted before the signal: it is answered
        assert answered.status_code == 200, answered.text
        assert srv.proc.wait(60) == 0
    finally:
        srv.stop()


# The load waits inside llama.cpp's reading of the file (its progress report) until GATE
# exists or the service stops loading: a load still under way at shutdown.
SLOW_READ_HOOK = """
import os
import sys
import time

if sys.orig_argv[1:4] == ["-m", "lmsp", "serve"]:
    from lmsp.service import models

    reported = models._LoadLog.__call__

    def slow_report(self, fraction):
        while not os.path.exists(GATE) and not self._aborting():
            time.sleep(0.01)
        return reported(self, fraction)

    models._LoadLog.__call__ = slow_report
"""


def test_a_load_under_way_at_shutdown_is_stopped_not_waited_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(f"GATE = {str(tmp_path / 'never')!r}\n{SLOW_READ_HOOK}")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    srv = start_server(tmp_path, loaded=False)
    try:
        with ThreadPoolExecutor(1) as pool:
            waiting = _waiting(pool, srv)
            srv.proc.send_signal(signal.SIGTERM)
            answered = waiting.result(timeout=60)
        assert answered.status_code == 503, answered.text
        assert srv.proc.wait(30) == 0  # the half-read model did not hold the exit
    finally:
        srv.stop()


def test_a_preload_llama_cpp_refuses_stops_the_service_saying_why(tmp_path: Path) -> None:
    broken = tmp_path / "models" / "Broken.Q4_1.gguf"
    broken.parent.mkdir()
    broken.write_bytes(b"GGUF" + bytes(range(256)) * 64)  # the magic, then no GGUF header
    command = [sys.executable, "-m", "lmsp", "serve", "--port", str(free_port()), "--no-discover"]
    command += ["--model-dir", str(broken.parent), "--preload", "broken:q4_1"]
    env = {**isolated_env(tmp_path), "LMSP_HOME": str(tmp_path / "data")}
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 1, done
    assert f"lmsp: --preload broken:q4_1: cannot load {broken}: llama.cpp could not load" in done.stderr
    assert ", loading)" in done.stdout  # it served while it loaded
    assert time.monotonic() - started < 30  # no drain, no hang


def test_the_embedded_default_preload_past_a_budget_still_serves(tmp_path: Path) -> None:
    """Not preloaded (it would be refused), so never `loading`: ready at once."""
    srv = start_server(tmp_path, "--no-discover", "--max-loaded-bytes", "50M", loaded=False)
    try:
        assert _ready(srv.url) == (200, {"status": "ready"})
        assert f"  model {MODEL} (embedded, llama.cpp, " in srv.log_path.read_text()
        assert ", loads on first use)" in srv.log_path.read_text()
    finally:
        srv.stop()
