"""`lmsp serve` refuses to start, clearly, when it cannot serve."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from helpers import MODEL
from lmsp.testing import free_port, isolated_env


def run_lmsp(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    """`lmsp ARGS` with a HOME of its own: the user's model stores are never read."""
    home = Path(tempfile.mkdtemp(prefix="lmsp-home-"))
    return subprocess.run(
        [sys.executable, "-m", "lmsp", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=isolated_env(home, **env),
    )


def test_port_in_use():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_lmsp("serve", "--port", str(port))
    assert result.returncode != 0
    assert f"port {port}" in result.stderr and "in use" in result.stderr


def test_unreadable_model_file(tmp_path):
    bad = tmp_path / "broken-1b.gguf"
    bad.write_bytes(b"this is not a gguf")
    result = run_lmsp("serve", "--port", str(free_port()), "--model-dir", str(tmp_path))
    assert result.returncode != 0
    assert str(bad) in result.stderr and "not a GGUF" in result.stderr


def test_missing_model_dir(tmp_path):
    result = run_lmsp("serve", "--port", str(free_port()), "--model-dir", str(tmp_path / "nope"))
    assert result.returncode != 0
    assert "is not a folder" in result.stderr


def test_models_lists_the_embedded_model_and_a_model_dir(tmp_path):
    from lmsp.engine.registry import embedded_model_path

    embedded = embedded_model_path()
    assert embedded is not None
    # A copy: a link to the embedded file would be the embedded model itself, listed once.
    shutil.copyfile(embedded, tmp_path / "Tiny-Test.Q8_0.gguf")
    (tmp_path / "Linked.gguf").symlink_to(embedded)
    result = run_lmsp("models", "--model-dir", str(tmp_path))
    assert result.returncode == 0
    ids = [line.split("\t")[0] for line in result.stdout.splitlines()]
    assert ids == [MODEL, "tiny:test-q8_0"]


def test_doctor_reports_the_build_and_the_choices():
    import json

    result = run_lmsp("doctor")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["device"] in ("cpu", "cuda", "metal")
    assert info["gpu_offload"] is (info["device"] != "cpu")
    [model] = [m for m in info["models"] if m["id"] == MODEL]
    assert model["context_window"] == 4096
    assert 1 <= model["parallel"] <= 8
    assert model["kv_bytes_per_token"] > 0


def test_models_lists_the_running_service_s_models(server):
    result = run_lmsp("models", "--url", server.url)
    assert result.returncode == 0, result.stderr
    assert f"the models of the service at {server.url}" in result.stderr
    rows = {line.split("\t")[0]: line.split("\t")[1:] for line in result.stdout.splitlines()}
    assert rows["scripted:test"] == ["-", "loaded", "cpu", "4096", "streaming,conversations"]  # only a service has it
    assert rows[MODEL][0] == "embedded"


def test_models_without_a_service_lists_what_serve_would_offer():
    result = run_lmsp("models", "--url", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 0
    assert "no service answers" in result.stderr
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == [MODEL]
