"""A user's install from our wheels (issue 37): the wheelhouse served as a PEP 503 index on
loopback, `pip install lmsp-server --extra-index-url <it>` into an empty venv, no sdist built,
and the installed `lmsp serve` answering on the embedded model.

The wheelhouse is the one .ci/run built (`LMSP_WHEELHOUSE`), else scripts/wheelhouse builds one
here (lmsp's wheel, and llama-cpp-python's from its cache outside the clone, or compiled once).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers import MODEL
from lmsp.local_service import answers
from lmsp.testing import free_port, isolated_env, stop_process

ROOT = Path(__file__).resolve().parents[2]
OURS = {"lmsp-server", "llama-cpp-python"}


@pytest.fixture(scope="module")
def index_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("whl")
    given = os.environ.get("LMSP_WHEELHOUSE")
    if given:
        for wheel in Path(given).glob("*.whl"):
            shutil.copy2(wheel, folder)
    else:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "wheelhouse"), str(folder)], check=True, timeout=3000)
    subprocess.run([sys.executable, str(ROOT / "scripts" / "wheel-index"), str(folder)], check=True)
    port = free_port()
    index = subprocess.Popen(
        [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(folder), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _serves(url):
            time.sleep(0.1)
        yield url
    finally:
        stop_process(index)


def _serves(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _normalized(name: str) -> str:
    """PEP 503's project name (the report gives llama-cpp-python's as llama_cpp_python)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _user_env(home: Path) -> dict[str, str]:
    """A user's environment: none of .ci/run's pip settings (its find-links, its build
    constraints), a HOME of its own, pip's cache shared with the machine's (a user's second
    install would have one too; the first downloads what PyPI serves, not what we build)."""
    env = {k: v for k, v in isolated_env(home).items() if not k.startswith("PIP_") and k != "VIRTUAL_ENV"}
    cache = os.environ.get("PIP_CACHE_DIR") or str(Path.home() / ".cache" / "pip")
    return {**env, "PIP_CACHE_DIR": cache, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


@pytest.mark.model
@pytest.mark.timeout(3600)
def test_pip_installs_from_the_index_without_compiling(index_url: str, tmp_path: Path) -> None:
    env = _user_env(tmp_path / "home")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    report = tmp_path / "report.json"
    started = time.monotonic()
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "--report", str(report)]
        # The versions CI tested, so that a release elsewhere cannot change this test's outcome.
        + ["--constraint", str(ROOT / "locks" / "test.txt"), "--extra-index-url", index_url, "lmsp-server"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
    )
    took = time.monotonic() - started
    print(f"pip install lmsp-server from the loopback index: {took:.1f} s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Building wheel" not in done.stdout, done.stdout
    installed = json.loads(report.read_text())["install"]
    urls = {_normalized(item["metadata"]["name"]): item["download_info"]["url"] for item in installed}
    # Every distribution came as a wheel: nothing was compiled on this machine.
    assert [name for name, url in urls.items() if not url.endswith(".whl")] == []
    # Ours came from our index (pip takes the highest version across indexes: a same-named
    # project elsewhere must not win).
    assert {name for name in OURS if urls[name].startswith(index_url)} == OURS, urls

    port = free_port()
    serve = subprocess.Popen(
        [str(venv / "bin" / "lmsp"), "serve", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**env, "LMSP_HOME": str(tmp_path / "lmsp-home")},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while not answers(url):
            assert serve.poll() is None and time.monotonic() < deadline, "the installed lmsp serve did not answer"
            time.sleep(0.2)
        body = {
            "model": MODEL,
            "max_output_tokens": 8,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
        }
        r = httpx.post(f"{url}/lmsp/v1/responses", json=body, timeout=120)
        assert r.status_code == 200, r.text
        answer = r.json()
        assert answer["status"] in ("completed", "incomplete")
        assert answer["usage"]["output_tokens"] > 0
    finally:
        stop_process(serve)
