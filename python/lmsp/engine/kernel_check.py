"""Does this llama.cpp's attention give a row the same bits whatever pass it is in? Asked of
the build at start-up, on synthetic data, in milliseconds, before `--draft auto` drafts.

A drafted step decodes a sequence's next token with the draft tokens after it: a pass of
several rows. A batched step decodes several sequences' tokens at once. Greedy text is plain
decoding's bit for bit only where flash attention gives a row the same result in those passes
as alone. On upstream's CPU kernel it does not past a 512-cell view of the cache (a lone row's
keys are split over the threads there, and summed in another order); our patched kernel
(scripts/patches, `LMSP_FA_DECODE` in the system info) does. The check runs ggml's
`flash_attn_ext` as llama.cpp calls it (F32 queries, F16 cache, F16 mask, F32 precision) on a
768-cell view with 600 cells visible, three query heads to a KV head, and compares the row's
output bytes: alone; first of a 4-row pass (a draft of 3); first of two sequences. The last is
reported (`lmsp doctor`), not a promise that a whole answer is the same batched: the matrix
products of a step that mixes other streams' prompts are another matter
(docs/operations/builds.md#what-each-build-keeps).
"""

from __future__ import annotations

import array
import ctypes
import random
import struct
from dataclasses import dataclass

from .ggml_api import ggml, init_params

__all__ = ["KernelCheck", "check_kernel"]

_F32, _F16 = 0, 1
_PREC_F32 = 10
_HEAD_DIM, _HEADS, _KV_HEADS = 64, 6, 2
_VIEW, _VISIBLE = 768, 600
_DRAFT_ROWS = 4
_NEG_INF_F16 = 0xFC00


@dataclass(frozen=True)
class KernelCheck:
    """Whether a row came out bit for bit as alone: in a drafted pass, in a batched one."""

    drafted: bool
    batched: bool
    device: str


def check_kernel(device_type: int = 0, threads: int = 2) -> KernelCheck:
    """On the first device of `device_type` (ggml's enum: 0 CPU, 1 GPU) with `threads` CPU
    threads. Raises RuntimeError where ggml cannot run the check there."""
    rng = random.Random(20261207)
    q = _f32([rng.uniform(-1, 1) for _ in range(_HEAD_DIM * _HEADS * _DRAFT_ROWS * 2)])
    k = _f16_noise(rng, _HEAD_DIM * _VIEW * _KV_HEADS * 2)
    v = _f16_noise(rng, _HEAD_DIM * _VIEW * _KV_HEADS * 2)
    lib = ggml()
    backend = lib.ggml_backend_init_by_type(device_type, None)
    if not backend:
        raise RuntimeError(f"ggml has no device of type {device_type}")
    try:
        reg = lib.ggml_backend_dev_backend_reg(lib.ggml_backend_get_device(backend))
        _set_threads(reg, backend, threads)
        device = lib.ggml_backend_reg_name(reg)
        alone = _attend(backend, q, k, v, rows=1, streams=1)
        drafted = _attend(backend, q, k, v, rows=_DRAFT_ROWS, streams=1)
        batched = _attend(backend, q, k, v, rows=1, streams=2)
    finally:
        lib.ggml_backend_free(backend)
    row = _HEAD_DIM * _HEADS * 4  # bytes of the first row's output: every head, F32
    return KernelCheck(
        drafted=drafted[:row] == alone[:row],
        batched=batched[:row] == alone[:row],
        device=(device or b"?").decode(),
    )


def _attend(backend: int, q: bytes, k: bytes, v: bytes, *, rows: int, streams: int) -> bytes:
    """flash_attn_ext's output for `rows` query rows of each of `streams` sequences. The first
    sequence's keys, values and first query row are the same in every call: only the pass
    around them changes."""
    lib = ggml()
    ctx = lib.ggml_init(init_params(16 << 20))
    if not ctx:
        raise RuntimeError("ggml_init failed")
    buffer = None
    try:
        tq = lib.ggml_new_tensor_4d(ctx, _F32, _HEAD_DIM, rows, _HEADS, streams)
        tk = lib.ggml_new_tensor_4d(ctx, _F16, _HEAD_DIM, _VIEW, _KV_HEADS, streams)
        tv = lib.ggml_new_tensor_4d(ctx, _F16, _HEAD_DIM, _VIEW, _KV_HEADS, streams)
        tm = lib.ggml_new_tensor_4d(ctx, _F16, _VIEW, rows, 1, streams)
        out = lib.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, _HEAD_DIM**-0.5, 0.0, 0.0)
        lib.ggml_prec_set_acc(out, _PREC_F32)
        graph = lib.ggml_new_graph(ctx)
        lib.ggml_build_forward_expand(graph, out)
        buffer = lib.ggml_backend_alloc_ctx_tensors(ctx, backend)
        if not buffer:
            raise RuntimeError("no buffer for the kernel check")
        # each row sees the visible cells and the draft rows before it, as a causal mask
        mask = b"".join(_mask_row(_VISIBLE + r) for _ in range(streams) for r in range(rows))
        q_rows = _rows(q, _HEAD_DIM * 4, rows, _HEADS, streams, _DRAFT_ROWS)
        kv = _HEAD_DIM * _VIEW * _KV_HEADS * 2 * streams
        for tensor, data in ((tq, q_rows), (tk, k[:kv]), (tv, v[:kv]), (tm, mask)):
            _set(tensor, data)
        if lib.ggml_backend_graph_compute(backend, graph) != 0:
            raise RuntimeError("ggml could not compute the kernel check")
        result = ctypes.create_string_buffer(lib.ggml_nbytes(out))
        lib.ggml_backend_tensor_get(out, result, 0, len(result))
        return result.raw
    finally:
        if buffer:
            lib.ggml_backend_buffer_free(buffer)
        lib.ggml_free(ctx)


def _rows(q: bytes, row_bytes: int, rows: int, heads: int, streams: int, stride: int) -> bytes:
    """`rows` of each head and stream out of a pool laid out [row][head][stream] `stride` rows
    deep: row 0 of head h of stream s is the same bytes whatever `rows` is."""
    picked = []
    for s in range(streams):
        for h in range(heads):
            for r in range(rows):
                at = ((s * heads + h) * stride + r) * row_bytes
                picked.append(q[at : at + row_bytes])
    return b"".join(picked)


def _mask_row(visible: int) -> bytes:
    return b"\x00\x00" * visible + struct.pack("<H", _NEG_INF_F16) * (_VIEW - visible)


def _set(tensor: int, data: bytes) -> None:
    ggml().ggml_backend_tensor_set(tensor, data, 0, len(data))


def _f32(values: list[float]) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def _f16_noise(rng: random.Random, count: int) -> bytes:
    """`count` F16 values in ±[0.5, 1): random sign and mantissa, exponent fixed (no NaN, no
    infinity), made from random bytes rather than one float at a time."""
    words = array.array("H", rng.randbytes(2 * count))
    return array.array("H", (w & 0x83FF | 0x3800 for w in words)).tobytes()


def _set_threads(reg: int, backend: int, threads: int) -> None:
    """The CPU backend's thread count (its default is 4); a GPU backend has no such setting."""
    address = ggml().ggml_backend_reg_get_proc_address(reg, b"ggml_backend_set_n_threads")
    if address:
        ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int)(address)(backend, threads)
