"""Test fixtures: a real `lmsp serve` (granian, real socket) on the embedded model, plus a
scripted model for the edge cases a real model cannot be made to produce on demand."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from helpers import SCRIPTED, checked_client
from lmsp.engine.llama import LlamaModel
from lmsp.engine.registry import embedded_model_path
from lmsp.testing import RunningServer, start_server


def _runs_haswell() -> bool:
    """Whether this CPU has what llama.cpp's haswell variant needs (AVX2, FMA, F16C, BMI2)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return {"avx", "avx2", "fma", "f16c", "bmi2"} <= set(flags)


# The e2e tests assert what the model answers (a schema answer completes, a request makes two
# tool calls), and llama.cpp's AVX-512 variants round otherwise than its AVX2 one: on an AVX-512
# machine (icelake, skylakex) four of them got other answers, on haswell none. So every server
# and engine of the suite runs the haswell variant where this CPU runs it, and the answers are
# the machine's no more; tests/e2e/test_cpu_variants.py checks the choice itself.
if "LMSP_CPU_VARIANT" not in os.environ and _runs_haswell():
    os.environ["LMSP_CPU_VARIANT"] = "haswell"


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # Keep-alives after 1 s of silence (15 s by default) so that a test can wait for one. The
    # model stays loaded all session (--keep-alive -1): a test that times a response must not
    # time a reload after a pause (tests/e2e/test_model_loading.py tests unloading).
    srv = start_server(
        tmp_path_factory.mktemp("lmsp"),
        "--parallel",
        "4",
        "--scripted-model",
        SCRIPTED,
        "--keepalive",
        "1",
        "--keep-alive",
        "-1",
    )
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def server_one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """One sequence at a time and a queue of one: where holding the model is observable."""
    srv = start_server(tmp_path_factory.mktemp("lmsp1"), "--parallel", "1", "--max-queue", "1", "--keep-alive", "-1")
    yield srv
    srv.stop()


@pytest.fixture()
def client(server: RunningServer) -> Iterator[httpx.Client]:
    with checked_client(server.url) as c:
        yield c


@pytest.fixture(scope="module")
def model() -> Iterator[LlamaModel]:
    """The embedded model, loaded once per module, for the tests that drive llama.cpp directly."""
    model = LlamaModel(embedded_model_path())
    yield model
    model.close()
