"""A llama.cpp build that uses AMX is refused where the OS gives no tile state (issue 37): a
clear error at start instead of a general protection fault at the first decode."""

from __future__ import annotations

import llama_cpp as ll
import pytest

from lmsp.engine.amx import AmxUnavailable, build_uses_amx, check_amx, tile_state_granted

NATIVE_SPR = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 | OPENMP = 1 | REPACK = 1 |"
PORTABLE = "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | OPENMP = 1 |"


def test_a_build_with_amx_is_refused_without_tile_state():
    assert build_uses_amx(NATIVE_SPR)
    with pytest.raises(AmxUnavailable, match="LMSP_ALLOW_AMX=1"):
        check_amx(NATIVE_SPR, granted=False, allow="")


def test_a_build_with_amx_runs_where_the_os_grants_it_or_the_user_insists():
    check_amx(NATIVE_SPR, granted=True, allow="")
    check_amx(NATIVE_SPR, granted=False, allow="1")


def test_a_build_without_amx_is_never_refused():
    assert not build_uses_amx(PORTABLE)
    check_amx(PORTABLE, granted=False, allow="")


def test_the_installed_build_passes_the_check_on_this_machine():
    # The machine's own answer (a VM that reports AMX may or may not grant it) and the
    # installed build's: whatever they are, a build that serves here passes.
    granted = tile_state_granted()
    assert isinstance(granted, bool)
    info = ll.llama_print_system_info().decode()
    if not build_uses_amx(info) or granted:
        check_amx(info)
