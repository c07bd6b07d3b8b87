"""The service knows the llama.cpp it runs (issue 48): our patch's marker (LMSP_FA_DECODE in the
system info), the CPU variant loaded, and the kernel check at start-up (engine/kernel_check.py:
a row alone, first of a drafted pass, first of two sequences, past a 512-cell view) decide
whether `--draft auto` drafts and what flash attention gets; `lmsp doctor` and the start-up
lines say so. On the build this suite runs on (our wheel) and on llama.cpp built from the same
sources without the patch (the bench's native build: `.ci/run` builds it before the tests and
names it in LMSP_UNPATCHED_LLAMA_LIB; without it that half skips)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from lmsp.engine.cpu_variants import library_dir
from lmsp.testing import isolated_env, start_server

MODEL = "smollm2:135m-instruct-q4_1"
UNPATCHED = os.environ.get("LMSP_UNPATCHED_LLAMA_LIB")
needs_unpatched = pytest.mark.skipif(
    not UNPATCHED, reason="LMSP_UNPATCHED_LLAMA_LIB names no llama.cpp built without our patch (.ci/run builds one)"
)
# A T=0 answer that copies its prompt: where drafts are on, prompt lookup proposes many.
COPY = (
    "Repeat this sentence exactly, twice: The keeper climbed the narrow stairs, lit the lamp and "
    "watched the ships pass slowly in the dark."
)


def _doctor(**env: str) -> dict[str, object]:
    home = Path(tempfile.mkdtemp(prefix="lmsp-home-"))
    done = subprocess.run(
        [sys.executable, "-m", "lmsp", "doctor"],
        capture_output=True,
        text=True,
        timeout=120,
        env=isolated_env(home, **env),
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _drafts_proposed(tmp_path: Path, **env: str) -> tuple[int, str]:
    """Draft tokens proposed for one copying answer, and the server's start-up lines."""
    server = start_server(tmp_path, "--no-discover", "--parallel", "1", env=isolated_env(tmp_path / "user", **env))
    try:
        body = {
            "model": MODEL,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": COPY}]}],
            "temperature": 0,
            "max_output_tokens": 48,
        }
        answer = httpx.post(f"{server.url}/lmsp/v1/responses", json=body, timeout=120)
        assert answer.status_code == 200, answer.text
        metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.stop()
    found = re.search(r'^lmsp_draft_tokens_total\{[^}]*result="proposed"[^}]*\} (\S+)$', metrics, re.MULTILINE)
    return (int(float(found.group(1))) if found else 0), server.log_path.read_text()


def test_the_wheel_build_is_patched_exact_and_names_its_cpu_variant():
    info = _doctor()
    assert info["patched"] is True, "this suite runs on our patched llama.cpp (scripts/install, scripts/wheelhouse)"
    assert info["kernel_check"] == {"device": "CPU", "drafted": True, "batched": True}
    assert info["drafts_exact"] is True
    variants = sorted(p.name for p in library_dir().glob("libggml-cpu-*"))
    if variants:  # our x86-64 wheel: one of its variants, chosen for this CPU
        assert f"libggml-cpu-{info['cpu_variant']}.so" in variants
        assert str(info["cpu_variant_reason"]).startswith(("the best of the ", "LMSP_CPU_VARIANT="))
    else:
        assert info["cpu_variant"] == "built in"


def test_the_wheel_build_drafts_and_says_so(tmp_path):
    proposed, log = _drafts_proposed(tmp_path)
    assert proposed > 0
    assert "lmsp's patched build" in log
    assert "drafts exact: a row's attention has the same bits in a drafted pass as alone" in log


@needs_unpatched
def test_a_build_without_the_patch_is_found_inexact_and_says_so():
    assert UNPATCHED
    info = _doctor(LLAMA_CPP_LIB_PATH=UNPATCHED)
    assert info["patched"] is False
    assert info["cpu_variant"] == "built in"
    # upstream's kernel splits a lone row's keys over the threads past 512 cells
    assert info["kernel_check"] == {"device": "CPU", "drafted": False, "batched": False}
    assert info["drafts_exact"] is False


@needs_unpatched
def test_a_build_without_the_patch_drafts_nothing_by_default(tmp_path):
    assert UNPATCHED
    proposed, log = _drafts_proposed(tmp_path, LLAMA_CPP_LIB_PATH=UNPATCHED)
    assert proposed == 0
    assert "a build without lmsp's patch" in log
    assert "--draft auto drafts nothing: a row's attention has other bits in a drafted pass" in log
