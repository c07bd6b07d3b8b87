"""`--flash-attn`: the choice a loaded model's context gets (docs/operations/concurrency.md#flash-attention)."""

from __future__ import annotations

import pytest

from lmsp.engine.backends import LlamaBackend, flash_attn_for
from lmsp.engine.registry import embedded_model_path
from lmsp.engine.scheduler import SchedulerConfig


@pytest.mark.parametrize(("choice", "expected"), [(None, True), (True, True), (False, False)])
def test_the_default_is_on_for_a_model_on_the_cpu_and_a_choice_is_kept(choice, expected):
    # None is `--flash-attn auto`: with no layer on a GPU and our patched kernel (the wheel this
    # suite runs on), the context gets it on, said outright.
    path = embedded_model_path()
    assert path is not None
    config = SchedulerConfig(n_parallel=1, ctx_per_sequence=256, n_threads=1, flash_attn=choice)
    backend = LlamaBackend(path, config, name="embedded", gpu_layers=0)
    try:
        assert backend.scheduler.ctx.config.flash_attn is expected
    finally:
        backend.close()


def test_a_build_without_the_exact_kernel_gets_llama_cpps_choice():
    # a GPU, or a CPU build without our patch (the kernel check fails): llama.cpp decides
    assert flash_attn_for(None, exact=False) is None
    assert flash_attn_for(None, exact=True) is True
    assert flash_attn_for(False, exact=True) is False
    assert flash_attn_for(True, exact=False) is True
