"""Thin, typed access to llama.cpp's low-level API (through llama-cpp-python's ctypes module).

Only this module and the scheduler touch `llama_cpp`; everything above speaks tokens and text.
Facts behind the choices here are in shared/ENGINE-NOTES.md.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp as ll

from .amx import AmxUnavailable, check_amx
from .cpu_variants import CpuBackend, library_dir, load_cpu_backend
from .kernel_check import KernelCheck, check_kernel

__all__ = [
    "Batch",
    "BuildUnusable",
    "Context",
    "LlamaModel",
    "LoadAborted",
    "ModelLoadError",
    "build_info",
    "check_build",
    "kernel_check",
]

log = logging.getLogger(__name__)

_backend_ready: CpuBackend | None = None

_GGML_LOG_ERROR = 4
_GGML_LOG_CONT = 5
_last_level = 0


@ll.llama_log_callback  # type: ignore[untyped-decorator]
def _log_errors_only(level: int, text: bytes, _user_data: object) -> None:
    # llama.cpp narrates every load in detail; a service's console shows only its errors.
    global _last_level
    if level != _GGML_LOG_CONT:
        _last_level = level
    if _last_level >= _GGML_LOG_ERROR and _last_level != _GGML_LOG_CONT:
        sys.stderr.write(text.decode("utf-8", "replace"))


class LoadAborted(Exception):
    """Raised by a load's `progress` to stop the load (the service is shutting down)."""


def _progress_callback(progress: Callable[[float], None]) -> object:
    def report(fraction: float, _user_data: object) -> bool:
        try:
            progress(fraction)
        except LoadAborted:
            return False  # llama.cpp stops reading the file and the load fails
        except Exception:  # a failing progress bar must not abort the load (False would)
            log.exception("load progress callback failed")
        return True

    return ll.llama_progress_callback(report)


class ModelLoadError(RuntimeError):
    """The GGUF could not be read or llama.cpp refused it."""


class BuildUnusable(RuntimeError):
    """The installed llama.cpp cannot run on this machine (no CPU variant for it, AMX)."""


def _ensure_backend() -> CpuBackend:
    global _backend_ready
    if _backend_ready is None:
        ll.llama_log_set(_log_errors_only, ctypes.c_void_p(0))
        ll.llama_backend_init()
        # Before any model or thread: the CPU variant for this machine (a build with variants
        # has no CPU backend until one is loaded), then a build that would fault on AMX is
        # refused, and the permission AMX needs is asked for the whole process.
        try:
            cpu = load_cpu_backend(library_dir())
            check_amx(_system_info())
        except (RuntimeError, AmxUnavailable) as exc:
            raise BuildUnusable(str(exc)) from None
        _backend_ready = cpu
    return _backend_ready


def _system_info() -> str:
    info: str = ll.llama_print_system_info().decode("utf-8", "replace")
    return info.strip()


def check_build() -> None:
    """Raises `BuildUnusable` where the installed llama.cpp build cannot run here; `lmsp serve`
    asks at start, so that it refuses at once rather than fault at the first decode."""
    _ensure_backend()


@functools.cache
def kernel_check(device: str) -> KernelCheck | None:
    """The build's answer to kernel_check.py on `device` ("cpu", else the GPU), asked once a
    process; None where the check could not run there (taken as inexact)."""
    _ensure_backend()
    try:
        return check_kernel(0 if device == "cpu" else 1, threads=min(4, os.cpu_count() or 1))
    except RuntimeError as exc:
        log.warning("the kernel check could not run on %s: %s", device, exc)
        return None


def build_info() -> dict[str, object]:
    """What the installed llama.cpp build can do: used by `lmsp doctor`, the start-up lines and
    the models list. `patched`: our llama.cpp patch is in it (its CPU backend lists
    LMSP_FA_DECODE); `cpu_variant`: the CPU backend loaded and why it."""
    cpu = _ensure_backend()
    system_info = _system_info()
    return {
        "llama_cpp_python": getattr(ll, "__version__", "unknown"),
        "gpu_offload": bool(ll.llama_supports_gpu_offload()),
        "patched": "LMSP_FA_DECODE = 1" in system_info,
        "cpu_variant": cpu.variant or "built in",
        "cpu_variant_reason": cpu.reason,
        "system_info": system_info,
    }


class LlamaModel:
    """One loaded GGUF: weights, vocabulary, metadata. Thread-safe for tokenization."""

    def __init__(self, path: Path, *, gpu_layers: int = 0, progress: Callable[[float], None] | None = None) -> None:
        """`progress`: called with the fraction loaded (0 to 1) as llama.cpp reads the file; it
        may raise `LoadAborted` to stop the load (ModelLoadError)."""
        _ensure_backend()
        if not os.access(path, os.R_OK):
            raise ModelLoadError(f"cannot read model file {path}")
        # Checked again at load, not only at discovery: a FIFO or device put in a model's place
        # since start-up would block the load or feed it garbage.
        if not path.is_file():
            raise ModelLoadError(f"{path} is not a regular file")
        params = ll.llama_model_default_params()
        params.n_gpu_layers = gpu_layers
        if progress is not None:
            report = _progress_callback(progress)  # referenced until the load returns
            params.progress_callback = report
        handle = ll.llama_model_load_from_file(os.fsencode(path), params)
        if not handle:
            raise ModelLoadError(f"llama.cpp could not load {path} (not a valid GGUF?)")
        self.path = path
        self.handle = handle
        self.vocab = ll.llama_model_get_vocab(handle)
        self.n_ctx_train: int = ll.llama_model_n_ctx_train(handle)
        self.n_vocab: int = ll.llama_vocab_n_tokens(self.vocab)
        self.n_embd: int = ll.llama_model_n_embd(handle)
        self._pieces: dict[int, bytes] = {}
        self._piece_buf = ctypes.create_string_buffer(256)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token takes in every layer (f16 keys and values)."""
        h = self.handle
        head_dim = ll.llama_model_n_embd(h) // max(1, ll.llama_model_n_head(h))
        return int(ll.llama_model_n_layer(h) * 2 * head_dim * ll.llama_model_n_head_kv(h) * 2)

    def close(self) -> None:
        if self.handle:
            ll.llama_model_free(self.handle)
            self.handle = None

    def meta(self, key: str) -> str | None:
        size = 1 << 16
        while True:
            buf = ctypes.create_string_buffer(size)
            n = ll.llama_model_meta_val_str(self.handle, key.encode(), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", "replace")
            size = n + 1

    def token_text(self, token: int) -> str:
        """The token's text as the vocabulary spells it (special tokens included)."""
        text: bytes = ll.llama_vocab_get_text(self.vocab, token)
        return text.decode("utf-8", "replace")

    @property
    def bos_text(self) -> str:
        bos = ll.llama_vocab_bos(self.vocab)
        return self.token_text(bos) if bos >= 0 else ""

    @property
    def eos_text(self) -> str:
        eos = ll.llama_vocab_eos(self.vocab)
        return self.token_text(eos) if eos >= 0 else ""

    @property
    def adds_bos(self) -> bool:
        return bool(ll.llama_vocab_get_add_bos(self.vocab))

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        while True:
            arr = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, data, len(data), arr, cap, add_special, True)
            if n >= 0:
                return arr[:n]
            cap = -n

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def end_tokens(self) -> list[int]:
        """Every end-of-generation token (an instruct model usually has several)."""
        return [t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(self.vocab, t)]

    def token_table(self) -> list[bytes | str]:
        """Every token in id order as the constraint engine wants it: the bytes a text token
        adds to the output, or the name of a control token (which adds nothing)."""
        table: list[bytes | str] = []
        control = ll.LLAMA_TOKEN_ATTR_CONTROL | ll.LLAMA_TOKEN_ATTR_UNUSED | ll.LLAMA_TOKEN_ATTR_UNKNOWN
        for token in range(self.n_vocab):
            if ll.llama_vocab_get_attr(self.vocab, token) & control:
                table.append(self.token_text(token))
            else:
                table.append(self.piece(token))
        return table

    def piece(self, token: int) -> bytes:
        """Bytes of a generated token; control tokens render as nothing. May split a UTF-8 char."""
        cached = self._pieces.get(token)
        if cached is None:
            buf = self._piece_buf
            n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = ll.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
            cached = buf.raw[:n]
            self._pieces[token] = cached
        return cached


# llama_flash_attn_type: AUTO, DISABLED, ENABLED.
_FLASH_ATTN = {None: -1, False: 0, True: 1}


@dataclass(frozen=True)
class ContextConfig:
    n_ctx: int
    n_seq_max: int
    n_batch: int
    n_threads: int
    # Flash attention: on, off, or None for llama.cpp's own choice.
    flash_attn: bool | None = None


class Context:
    """A llama_context: KV cache cells for `n_seq_max` sequences. Owned by one thread."""

    def __init__(self, model: LlamaModel, config: ContextConfig) -> None:
        params = ll.llama_context_default_params()
        params.n_ctx = config.n_ctx
        params.n_batch = config.n_batch
        params.n_ubatch = config.n_batch
        params.n_seq_max = config.n_seq_max
        params.n_threads = config.n_threads
        params.n_threads_batch = config.n_threads
        # A unified cache changed greedy outputs of batched sequences (ENGINE-NOTES); split keeps
        # each sequence's result identical to running it alone.
        params.kv_unified = False
        params.flash_attn_type = _FLASH_ATTN[config.flash_attn]
        params.no_perf = True
        handle = ll.llama_init_from_model(model.handle, params)
        if not handle:
            raise ModelLoadError("llama.cpp could not create a context (out of memory?)")
        self.handle = handle
        self.config = config
        self.memory = ll.llama_get_memory(handle)

    def close(self) -> None:
        if self.handle:
            ll.llama_free(self.handle)
            self.handle = None

    def decode(self, batch: Batch) -> int:
        return int(ll.llama_decode(self.handle, batch.raw))

    def logits_address(self, batch_index: int) -> int:
        """Where the logits of a batch entry are: valid until the next decode."""
        return ctypes.cast(ll.llama_get_logits_ith(self.handle, batch_index), ctypes.c_void_p).value or 0

    def copy(self, src: int, dst: int) -> None:
        """Makes `dst` hold every KV cell `src` holds (what `dst` held is dropped). With one
        cache per sequence the data is copied, a whole sequence's cache at once, at the start
        of the next decode."""
        ll.llama_memory_seq_cp(self.memory, src, dst, -1, -1)

    def save_state(self, seq: int) -> bytearray | None:
        """A sequence's KV cells as llama.cpp serialises them (its per-sequence state: cell
        positions, then every layer's keys and values), or None when llama.cpp wrote nothing."""
        size = int(ll.llama_state_seq_get_size(self.handle, seq))
        if size <= 0:
            return None
        data = bytearray(size)  # written in place: no second copy of tens of MB
        view = (ctypes.c_uint8 * size).from_buffer(data)
        written = int(ll.llama_state_seq_get_data(self.handle, view, size, seq))
        del view  # a live export would pin the bytearray's size
        return data if written == size else None

    def load_state(self, seq: int, data: bytearray) -> bool:
        """Replaces a sequence's KV cells with a saved state. On False (a state from another
        model or window, or too little room) llama.cpp has left the sequence empty."""
        view = (ctypes.c_uint8 * len(data)).from_buffer(data)
        try:
            return int(ll.llama_state_seq_set_data(self.handle, view, len(data), seq)) == len(data)
        finally:
            del view

    def forget(self, seq: int, from_pos: int = 0) -> None:
        """Drop a sequence's KV cells from `from_pos` on; whole sequence if partial removal fails."""
        if not ll.llama_memory_seq_rm(self.memory, seq, from_pos, -1) and from_pos > 0:
            ll.llama_memory_seq_rm(self.memory, seq, 0, -1)


class Batch:
    """A reusable llama_batch; tokens are added one by one, each for one sequence."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.raw = ll.llama_batch_init(capacity, 0, 1)
        self.n = 0

    def clear(self) -> None:
        self.n = 0
        self.raw.n_tokens = 0

    def add(self, token: int, pos: int, seq: int, want_logits: bool) -> int:
        """Adds one token; returns its index in the batch (where its logits will be)."""
        i = self.n
        raw = self.raw
        raw.token[i] = token
        raw.pos[i] = pos
        raw.n_seq_id[i] = 1
        raw.seq_id[i][0] = seq
        raw.logits[i] = want_logits
        self.n = i + 1
        raw.n_tokens = self.n
        return i

    def close(self) -> None:
        if self.raw is not None:
            ll.llama_batch_free(self.raw)
            self.raw = None


class EmbeddingContext:
    """A second llama_context for embeddings: it pools each sequence's hidden states into one
    vector (the model's own pooling, mean where the GGUF names none: a chat model's has none,
    and "none" would give a vector per token). Owned by the scheduler's thread, as the
    generating context is; made on the first embedding request, so a model nobody embeds
    with pays nothing for it."""

    def __init__(self, model: LlamaModel, *, n_ctx: int, n_seq_max: int, n_threads: int) -> None:
        params = ll.llama_context_default_params()
        params.n_ctx = n_ctx
        # A pooled sequence must be decoded in one ubatch: a batch is at most one window.
        params.n_batch = n_ctx
        params.n_ubatch = n_ctx
        params.n_seq_max = n_seq_max
        params.n_threads = n_threads
        params.n_threads_batch = n_threads
        params.embeddings = True
        params.pooling_type = self._pooling(model)
        # Every sequence is cleared after its batch: one shared cache lets any one input use it all.
        params.kv_unified = True
        params.no_perf = True
        handle = ll.llama_init_from_model(model.handle, params)
        if not handle:
            raise ModelLoadError("llama.cpp could not create an embedding context (out of memory?)")
        self.handle = handle
        self.n_ctx = n_ctx
        self.n_seq_max = n_seq_max
        self.dimensions: int = ll.llama_model_n_embd(model.handle)
        self.memory = ll.llama_get_memory(handle)
        self.batch = Batch(n_ctx)

    @staticmethod
    def _pooling(model: LlamaModel) -> int:
        arch = model.meta("general.architecture") or ""
        declared = model.meta(f"{arch}.pooling_type")
        if declared is not None and declared.isdigit() and int(declared) != ll.LLAMA_POOLING_TYPE_NONE:
            return int(ll.LLAMA_POOLING_TYPE_UNSPECIFIED)  # the model's own
        return int(ll.LLAMA_POOLING_TYPE_MEAN)

    def embed(self, inputs: list[list[int]]) -> list[list[float]]:
        """One decode for up to `n_seq_max` inputs of at most `n_ctx` tokens in all; each
        vector scaled to unit length (as llama-server and OpenAI give them), so a dot product
        is the cosine. Raises RuntimeError when llama.cpp refuses the batch."""
        batch = self.batch
        batch.clear()
        for seq, tokens in enumerate(inputs):
            for pos, token in enumerate(tokens):
                batch.add(token, pos, seq, True)
        try:
            rc = int(ll.llama_decode(self.handle, batch.raw))
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc} for an embedding batch")
            vectors: list[list[float]] = []
            for seq in range(len(inputs)):
                pointer = ll.llama_get_embeddings_seq(self.handle, seq)
                if not pointer:
                    raise RuntimeError("llama.cpp gave no pooled embedding")
                vector = pointer[: self.dimensions]
                norm = sum(x * x for x in vector) ** 0.5
                vectors.append([x / norm for x in vector] if norm > 0 else vector)
            return vectors
        finally:
            ll.llama_memory_clear(self.memory, True)

    def close(self) -> None:
        self.batch.close()
        if self.handle:
            ll.llama_free(self.handle)
            self.handle = None
