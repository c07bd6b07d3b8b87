"""Whether a llama.cpp build that uses AMX may run here.

AMX's tile registers are state the OS must enable (XCR0 bits 17 and 18) and, on Linux >= 5.16,
grant each process that asks (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`). Virtual machines
on AMX CPUs often report AMX in cpuid while the hypervisor leaves that state off: a build
compiled for the CPU (`-march=native`, llama-cpp-python's source build) then dies on its first
`ldtilecfg`, a general protection fault in the middle of a decode. Our wheel's AMX variant is
loaded only on request (engine/cpu_variants.py); a source build that uses AMX is checked here
before llama.cpp runs, and refused with the way out, unless `LMSP_ALLOW_AMX=1` says to try anyway.

The kernel's view of XCR0 is read with `ARCH_GET_XCOMP_SUPP` (the features it enabled, which
it takes from XCR0), and the permission is asked for on the spot: process-wide, so the worker
threads llama.cpp starts later have it too (llama.cpp asks on its main thread only).
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

__all__ = ["AmxUnavailable", "amx_allowed", "build_uses_amx", "check_amx", "tile_state_granted"]

_SYS_ARCH_PRCTL = 158  # x86-64
_ARCH_GET_XCOMP_SUPP = 0x1021
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILECFG = 17
_XFEATURE_XTILEDATA = 18
_TILE_STATE = (1 << _XFEATURE_XTILECFG) | (1 << _XFEATURE_XTILEDATA)


class AmxUnavailable(RuntimeError):
    """The llama.cpp build uses AMX and this machine does not give this process its state."""


def build_uses_amx(system_info: str) -> bool:
    """From `llama_print_system_info()`: ggml's CPU backend lists AMX_INT8 = 1 when compiled
    with it."""
    return "AMX_INT8 = 1" in system_info.upper()


def tile_state_granted() -> bool:
    """True when the kernel enabled AMX's tile state and granted it to this process."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    supported = ctypes.c_uint64(0)
    if libc.syscall(_SYS_ARCH_PRCTL, _ARCH_GET_XCOMP_SUPP, ctypes.byref(supported)) != 0:
        return False  # a kernel before 5.16: no dynamic xstate, no AMX for user space
    if supported.value & _TILE_STATE != _TILE_STATE:
        return False
    return bool(libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0)


def amx_allowed(allow: str | None = None) -> bool:
    """`LMSP_ALLOW_AMX` (or `allow`) says to use AMX whatever the OS grants."""
    return (os.environ.get("LMSP_ALLOW_AMX", "") if allow is None else allow).strip() in ("1", "true", "yes")


def check_amx(system_info: str, *, granted: bool | None = None, allow: str | None = None) -> None:
    """Raises `AmxUnavailable` for a build that would fault on its first AMX instruction.
    `granted` and `allow` default to this machine and `LMSP_ALLOW_AMX`."""
    if not build_uses_amx(system_info):
        return
    if amx_allowed(allow) or (tile_state_granted() if granted is None else granted):
        return
    raise AmxUnavailable(
        "this llama.cpp build uses AMX, which this CPU reports but the OS (or the hypervisor) does "
        "not enable for this process: its first AMX instruction would crash the server. Install "
        "lmsp's portable wheels (docs/operations/builds.md), or rebuild llama-cpp-python without AMX: "
        "CMAKE_ARGS=\"-DCMAKE_C_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16' "
        "-DCMAKE_CXX_FLAGS='-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'\" pip install --force-reinstall "
        "--no-cache-dir llama-cpp-python. LMSP_ALLOW_AMX=1 tries anyway."
    )
