"""Every `lmsp serve` flag can be set in the environment as LMSP_<FLAG>; the flag wins."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lmsp.testing import free_port, isolated_env


def serve(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmsp", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=isolated_env(home, **env),
    )


def test_serve_help_names_the_variable_of_every_flag(tmp_path):
    result = serve(tmp_path, "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # argparse wraps lines anywhere
    flags = [f for f in re.findall(r"^  (--[a-z-]+)", result.stdout, re.MULTILINE) if f != "--help"]
    assert {"--host", "--port", "--model-dir", "--keep-alive", "--max-loaded", "--preload", "--no-discover"} <= set(
        flags
    )
    for flag in flags:
        var = "LMSP_MODEL_DIRS" if flag == "--model-dir" else "LMSP_" + flag[2:].upper().replace("-", "_")
        assert re.search(rf"{re.escape(flag)}\b.*?\[env {var}\]", text), flag


@pytest.mark.parametrize(
    ("var", "value", "says"),
    [
        ("LMSP_PORT", "eighty", "invalid int value"),
        ("LMSP_MAX_LOADED", "2.5", "invalid int value"),
        ("LMSP_KEEP_ALIVE", "soon", "not a duration"),
        ("LMSP_NO_DISCOVER", "maybe", "expected one of"),
        ("LMSP_LOG_FORMAT", "xml", "invalid choice"),
    ],
)
def test_a_bad_value_in_the_environment_names_the_variable(tmp_path, var, value, says):
    result = serve(tmp_path, **{var: value})
    assert result.returncode == 2
    assert f"environment variable {var}={value!r}" in result.stderr and says in result.stderr
    assert "Traceback" not in result.stderr


def test_a_bad_serve_variable_leaves_other_commands_alone(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "lmsp", "token", "list", "--data-dir", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=60,
        env=isolated_env(tmp_path, LMSP_PORT="eighty"),
    )
    assert result.returncode == 0, result.stderr


def test_the_environment_is_read_and_the_flag_wins(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        from_env = serve(tmp_path, LMSP_PORT=str(port))
        flag_wins = serve(tmp_path, "--port", str(port), LMSP_PORT=str(free_port()))
    for result in (from_env, flag_wins):
        assert result.returncode == 1
        assert f"port {port} on 127.0.0.1 is already in use" in result.stderr


def test_model_dirs_are_separated_like_paths(tmp_path):
    dirs = [tmp_path / "a", tmp_path / "missing"]
    dirs[0].mkdir()
    result = serve(tmp_path, "--port", str(free_port()), LMSP_MODEL_DIRS=os.pathsep.join(map(str, dirs)))
    assert result.returncode == 2
    assert f"--model-dir {dirs[1]} is not a folder" in result.stderr
