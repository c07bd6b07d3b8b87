"""Which of llama.cpp's CPU variants this process runs, loaded before the first model.

Our x86-64 wheel builds ggml's CPU backend once per CPU level (scripts/wheelhouse:
`GGML_BACKEND_DL`, eight of `GGML_CPU_ALL_VARIANTS`), each a `libggml-cpu-<level>` beside
libllama. llama-cpp-python loads none of them (`llama_backend_init` loads nothing), and ggml's
own `ggml_backend_load_all` takes the highest score, AMX included: on a VM that reports AMX and
grants no tile state, that variant faults on its first decode. So lmsp chooses: each variant
scores itself against this CPU (0: it cannot run here), a variant that uses AMX is passed over
unless `LMSP_ALLOW_AMX=1` asks for it, and the best of the rest is loaded. The OS's grant is not
enough: on a VM whose kernel granted the tile state (and where AMX instructions ran), that
variant's mul_mat still died on its first multi-token decode (`tilezero`, an invalid opcode, in
every decode thread), so AMX is the user's choice, made where it was seen to work.
`LMSP_CPU_VARIANT=<level>` loads that one instead (if this CPU runs it), as Ollama's
`OLLAMA_LLM_LIBRARY` does: the variants round differently, so the same answers on every
machine take the same variant (the test suite runs `haswell`, tests/conftest.py). A build
with its CPU backend inside libggml (a source build, the CUDA and Metal wheels, llama.cpp
through `LLAMA_CPP_LIB_PATH`) has nothing to choose.
"""

from __future__ import annotations

import ctypes
import os
import re
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll

from .amx import amx_allowed
from .ggml_api import ggml, reg_features

__all__ = ["Candidate", "CpuBackend", "choose", "library_dir", "load_cpu_backend"]

_TAG = re.compile(r"(?:lib)?ggml-cpu-(.+)\.(?:so|dll|dylib)")


@dataclass(frozen=True)
class Candidate:
    """One variant library: its level, its score here (0: cannot run here) and whether it uses
    AMX (known only for those that can run: asking a variant its features runs its code)."""

    tag: str
    path: Path
    score: int
    amx: bool = False


@dataclass(frozen=True)
class CpuBackend:
    """What runs: `variant` None where the build has one CPU backend inside libggml."""

    variant: str | None
    reason: str


def choose(
    candidates: list[Candidate], *, amx_allowed: bool, wanted: str | None = None
) -> tuple[Candidate | None, str]:
    """The best-scoring variant that can run here (or the one `wanted`, if it can), and why
    it, in a line."""
    runnable = [c for c in candidates if c.score > 0]
    if wanted:
        named = [c for c in runnable if c.tag == wanted]
        of = f"of the {len(runnable)} of {len(candidates)} variants this CPU runs"
        if not named:
            return None, f"LMSP_CPU_VARIANT={wanted} is not one {of} ({', '.join(c.tag for c in runnable)})"
        return named[0], f"LMSP_CPU_VARIANT={wanted}, one {of}"
    passed_over = [c for c in runnable if c.amx and not amx_allowed]
    eligible = [c for c in runnable if c not in passed_over]
    if not eligible:
        return None, f"none of the {len(candidates)} CPU variants runs on this CPU"
    best = max(eligible, key=lambda c: c.score)
    why = f"the best of the {len(runnable)} of {len(candidates)} variants this CPU runs"
    if passed_over:
        why += f"; {', '.join(c.tag for c in passed_over)} passed over: AMX, used only with LMSP_ALLOW_AMX=1"
    return best, why


def load_cpu_backend(lib_dir: Path) -> CpuBackend:
    """Loads the CPU variant for this machine from `lib_dir`, once; raises RuntimeError where
    the build has variants and none can run here."""
    lib = ggml()
    if lib.ggml_backend_reg_by_name(b"CPU"):
        return CpuBackend(None, "one CPU build, inside libggml")
    paths = sorted(p for p in lib_dir.iterdir() if _TAG.fullmatch(p.name)) if lib_dir.is_dir() else []
    if not paths:
        raise RuntimeError(f"this llama.cpp build has no CPU backend: no libggml-cpu-* in {lib_dir}")
    candidates = [_candidate(path) for path in paths]
    wanted = os.environ.get("LMSP_CPU_VARIANT", "").strip() or None
    best, why = choose(candidates, amx_allowed=amx_allowed(), wanted=wanted)
    if best is None:
        raise RuntimeError(why)
    if not lib.ggml_backend_load(os.fsencode(best.path)):
        raise RuntimeError(f"llama.cpp could not load its CPU variant {best.path}")
    return CpuBackend(best.tag, why)


def _candidate(path: Path) -> Candidate:
    match = _TAG.fullmatch(path.name)
    assert match is not None
    module = ctypes.CDLL(str(path))  # ggml's own loader opens each variant to score it, too
    module.ggml_backend_score.restype = ctypes.c_int
    score = int(module.ggml_backend_score())
    amx = False
    if score > 0:
        module.ggml_backend_init.restype = ctypes.c_void_p
        reg = module.ggml_backend_init()  # a registration to ask, not yet registered
        amx = reg_features(reg).get("AMX_INT8") == "1" if reg else False
    return Candidate(match.group(1), path, score, amx)


def library_dir() -> Path:
    """Where llama-cpp-python loaded libllama from (LLAMA_CPP_LIB_PATH, else its lib/)."""
    return Path(ll.llama_cpp._base_path)
