"""The few ggml functions lmsp calls itself, through ctypes, beside llama-cpp-python's bindings
(which cover llama.h only): loading a CPU variant (cpu_variants.py) and the kernel self-test
(kernel_check.py).

They are looked up through libllama's handle, whose lookups reach the libraries it links
(libggml, libggml-base): a `CDLL` of libggml by its path could load a second copy of it, with a
backend registry of its own, where the wheel holds several copies of one library.
"""

from __future__ import annotations

import ctypes
from functools import cache

import llama_cpp as ll

__all__ = ["GgmlFeature", "ggml", "init_params", "reg_features"]

_p = ctypes.c_void_p
_i64 = ctypes.c_int64


class GgmlInitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", _p), ("no_alloc", ctypes.c_bool)]


class GgmlFeature(ctypes.Structure):
    """`struct ggml_backend_feature`: a backend's features end with a NULL name."""

    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


_FEATURES_FN = ctypes.CFUNCTYPE(ctypes.POINTER(GgmlFeature), _p)

# name: (result type, argument types)
_SIGNATURES: dict[str, tuple[object, list[object]]] = {
    "ggml_backend_reg_by_name": (_p, [ctypes.c_char_p]),
    "ggml_backend_reg_name": (ctypes.c_char_p, [_p]),
    "ggml_backend_reg_get_proc_address": (_p, [_p, ctypes.c_char_p]),
    "ggml_backend_load": (_p, [ctypes.c_char_p]),
    "ggml_backend_init_by_type": (_p, [ctypes.c_int, ctypes.c_char_p]),
    "ggml_backend_get_device": (_p, [_p]),
    "ggml_backend_dev_backend_reg": (_p, [_p]),
    "ggml_backend_free": (None, [_p]),
    "ggml_backend_graph_compute": (ctypes.c_int, [_p, _p]),
    "ggml_backend_alloc_ctx_tensors": (_p, [_p, _p]),
    "ggml_backend_buffer_free": (None, [_p]),
    "ggml_backend_tensor_set": (None, [_p, _p, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_backend_tensor_get": (None, [_p, _p, ctypes.c_size_t, ctypes.c_size_t]),
    "ggml_init": (_p, [GgmlInitParams]),
    "ggml_free": (None, [_p]),
    "ggml_new_tensor_4d": (_p, [_p, ctypes.c_int, _i64, _i64, _i64, _i64]),
    "ggml_nbytes": (ctypes.c_size_t, [_p]),
    "ggml_flash_attn_ext": (_p, [_p, _p, _p, _p, _p, ctypes.c_float, ctypes.c_float, ctypes.c_float]),
    "ggml_prec_set_acc": (ctypes.c_bool, [_p, ctypes.c_int]),
    "ggml_new_graph": (_p, [_p]),
    "ggml_build_forward_expand": (None, [_p, _p]),
}


@cache
def ggml() -> ctypes.CDLL:
    """libllama's handle with the signatures above set (ggml's symbols resolve through it)."""
    lib: ctypes.CDLL = ll.llama_cpp._lib
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    return lib


def reg_features(reg: int) -> dict[str, str]:
    """A backend registration's features (`ggml_backend_get_features`), e.g. {"AVX2": "1"}."""
    address = ggml().ggml_backend_reg_get_proc_address(reg, b"ggml_backend_get_features")
    if not address:
        return {}
    features = _FEATURES_FN(address)(reg)
    found: dict[str, str] = {}
    i = 0
    while features[i].name is not None:
        found[features[i].name.decode()] = (features[i].value or b"").decode()
        i += 1
    return found


def init_params(mem_size: int) -> GgmlInitParams:
    """Metadata only: the tensors' data goes in a backend buffer."""
    return GgmlInitParams(mem_size=mem_size, mem_buffer=None, no_alloc=True)
