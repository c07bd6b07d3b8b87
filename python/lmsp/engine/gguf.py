"""The few facts `/api/tags` and `/api/show` tell about a model, read from its GGUF header
without loading it (as Ollama reads them): architecture, size, quantization, context length;
and its shape (layers, heads) for the memory estimate `--max-loaded-bytes` budgets with.

Only scalar metadata is kept; arrays (the vocabulary: tens of thousands of strings) are
skipped. The header is untrusted input: counts and lengths are bounded, and a file that is not
what it claims gives no facts rather than an error.
"""

from __future__ import annotations

import functools
import struct
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["FILE_TYPES", "gguf_facts"]

_MAGIC = b"GGUF"
_MAX_KEYS = 4096
_MAX_STRING = 1 << 20  # a chat template is the longest scalar a GGUF usually holds
# type id → struct format of the scalars (8: string, 9: array)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
# general.file_type → the quantization's name, as Ollama shows it (llama.cpp's llama_ftype).
FILE_TYPES = {
    0: "F32",
    1: "F16",
    2: "Q4_0",
    3: "Q4_1",
    7: "Q8_0",
    8: "Q5_0",
    9: "Q5_1",
    10: "Q2_K",
    11: "Q3_K_S",
    12: "Q3_K_M",
    13: "Q3_K_L",
    14: "Q4_K_S",
    15: "Q4_K_M",
    16: "Q5_K_S",
    17: "Q5_K_M",
    18: "Q6_K",
    32: "BF16",
}


class _Bad(Exception):
    pass


def _read(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise _Bad
    return data


def _string(f: BinaryIO, keep: bool = True) -> str | None:
    (n,) = struct.unpack("<Q", _read(f, 8))
    if n > _MAX_STRING:
        raise _Bad
    data = _read(f, n)
    return data.decode("utf-8", "replace") if keep else None


def _skip(f: BinaryIO, kind: int) -> None:
    if kind == 8:
        _string(f, keep=False)
    elif kind in _SCALARS:
        _read(f, struct.calcsize(_SCALARS[kind]))
    else:
        raise _Bad


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == 8:
        return _string(f)
    if kind in _SCALARS:
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
    if kind == 9:
        (item_kind,) = struct.unpack("<I", _read(f, 4))
        (count,) = struct.unpack("<Q", _read(f, 8))
        if item_kind in _SCALARS:  # fixed-size items: skipped in one seek
            f.seek(count * struct.calcsize(_SCALARS[item_kind]), 1)
        else:
            for _ in range(count):
                _skip(f, item_kind)
        return None
    raise _Bad


def _facts(path: Path) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    try:
        with path.open("rb") as raw:
            f: BinaryIO = raw
            if _read(f, 4) != _MAGIC:
                return {}
            (version,) = struct.unpack("<I", _read(f, 4))
            if version < 2:
                return {}
            _tensors, n_keys = struct.unpack("<QQ", _read(f, 16))
            for _ in range(min(n_keys, _MAX_KEYS)):
                key = _string(f)
                (kind,) = struct.unpack("<I", _read(f, 4))
                value = _value(f, kind)
                if key is not None and value is not None:
                    facts[key] = value
    except (OSError, _Bad, struct.error, ValueError):
        pass  # what was read so far is all there is to tell
    return facts


@functools.lru_cache(maxsize=64)
def _cached(path: Path, _mtime_ns: int, _size: int) -> dict[str, Any]:
    return _facts(path)


def gguf_facts(path: Path) -> dict[str, Any]:
    """The file's scalar metadata (`general.architecture`, `llama.context_length`, …); {} for
    a file that cannot be read as GGUF."""
    try:
        st = path.stat()
    except OSError:
        return {}
    return _cached(path, st.st_mtime_ns, st.st_size)
