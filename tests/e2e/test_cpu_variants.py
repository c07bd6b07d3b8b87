"""Every x86-64 level runs the build we test (issue 48): the installed wheel's llama.cpp, served
under qemu's user mode as older and newer CPUs, loads the CPU variant for that CPU and answers.
One x86-64-v3 build died with SIGILL on SandyBridge and Nehalem. qemu's TCG has no AVX-512, so
its Skylake-Server is a Haswell with more cache to the variants' scoring: it gets haswell.
Skips with the reason where qemu-x86_64 (Debian's qemu-user) is missing or the build has no
variants (a source build of llama-cpp-python)."""

from __future__ import annotations

import platform
import re
import shutil

import httpx
import pytest

from lmsp.engine.cpu_variants import library_dir
from lmsp.testing import isolated_env, start_server

MODEL = "smollm2:135m-instruct-q4_1"
QEMU = shutil.which("qemu-x86_64")

pytestmark = [
    pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 variants"),
    pytest.mark.skipif(QEMU is None, reason="qemu-x86_64 is not installed (Debian: qemu-user)"),
    pytest.mark.skipif(not any(library_dir().glob("libggml-cpu-*")), reason="this llama.cpp build has no CPU variants"),
]


@pytest.mark.parametrize(
    ("cpu", "variant"),
    [("Nehalem", "sse42"), ("SandyBridge", "sandybridge"), ("Haswell", "haswell"), ("Skylake-Server", "haswell")],
)
def test_the_wheel_serves_on_this_cpu_with_its_variant(tmp_path, cpu, variant):
    assert QEMU is not None
    server = start_server(
        tmp_path,
        "--no-discover",
        "--parallel",
        "1",
        "--threads",
        "2",
        env=isolated_env(tmp_path / "user", LMSP_CPU_VARIANT=""),  # lmsp's own choice
        timeout=600,
        launcher=(QEMU, "-cpu", cpu),
    )
    try:
        body = {
            "model": MODEL,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}],
            "temperature": 0,
            "max_output_tokens": 8,
        }
        answer = httpx.post(f"{server.url}/lmsp/v1/responses", json=body, timeout=600)
    finally:
        server.stop()
    assert answer.status_code == 200, answer.text
    response = answer.json()
    assert response["status"] in ("completed", "incomplete")
    assert response["usage"]["output_tokens"] > 0
    line = re.search(r"CPU variant (\S+) \(", server.log_path.read_text())
    assert line is not None, server.log_path.read_text()
    assert line.group(1) == variant
