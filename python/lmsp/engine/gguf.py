"""The few facts `/api/tags` and `/api/show` tell about a model, read from its GGUF header
without loading it (as Ollama reads them): architecture, size, quantization, context length;
and its shape (layers, heads) for the memory estimate `--max-loaded-bytes` budgets with.

Only scalar metadata is kept; arrays (the vocabulary: tens of thousands of strings) are
skipped. The header is untrusted input: counts, lengths and the bytes read are bounded, and a
file that is not what it claims gives no facts rather than an error. The path is opened as
discovery's `confirm` opens it, without waiting, and only a regular file is read: a FIFO or a
device swapped in since discovery gives no facts instead of holding a worker thread for ever.

Facts are kept per file identity (path, device, inode, size, modification time) for up to
`CACHE_ENTRIES` files, so `/api/tags` on a store of that many models reads each header once; a
file changed in place is read again.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, BinaryIO

__all__ = ["CACHE_ENTRIES", "FILE_TYPES", "gguf_facts"]

_MAGIC = b"GGUF"
_MAX_KEYS = 4096
_MAX_STRING = 1 << 20  # a chat template is the longest scalar a GGUF usually holds
# The metadata section is read no further than this: the largest real ones (a 262k-token
# vocabulary with its scores and merges) are ~16 MB. Without it a sparse file declaring 2^40
# empty strings keeps a worker thread skipping them for hours.
_MAX_HEADER = 64 << 20
# Items of an array of strings: 8× the largest vocabulary (262,144 tokens). Each costs a step
# of a Python loop, so this bounds the time too (~2 s at most).
_MAX_ITEMS = 1 << 21
# The text one file's facts keep: several chat templates' worth (the longest are ~100 KB).
_MAX_KEPT = 1 << 20
# Files whose facts are kept, and the text they may keep in all. A fact set is a few KB (the
# chat template is most of it), so a store of CACHE_ENTRIES models fits; a larger store reads
# the headers past that again each listing.
CACHE_ENTRIES = 4096
_CACHE_BYTES = 64 << 20
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
            if count > _MAX_ITEMS:
                raise _Bad
            for _ in range(count):
                _skip(f, item_kind)
                if f.tell() > _MAX_HEADER:
                    raise _Bad
        return None
    raise _Bad


def _parse(f: BinaryIO) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    kept = 0
    try:
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
            if isinstance(value, str) and (kept := kept + len(value)) > _MAX_KEPT:
                value = None  # past the text one file's facts may keep
            if key is not None and value is not None:
                facts[key] = value
            if f.tell() > _MAX_HEADER:
                break
    except (OSError, _Bad, struct.error, ValueError):
        pass  # what was read so far is all there is to tell
    return facts


_Key = tuple[str, int, int, int, int]


class _Cache:
    """Facts by file identity, least recently read dropped first, bounded in entries and in
    the text they keep. Locked: /api/tags reads headers on worker threads."""

    def __init__(self, entries: int, size: int) -> None:
        self.entries, self.size, self.held = entries, size, 0
        self.lock = threading.Lock()
        self.kept: OrderedDict[_Key, tuple[dict[str, Any], int]] = OrderedDict()

    def get(self, key: _Key) -> dict[str, Any] | None:
        with self.lock:
            hit = self.kept.get(key)
            if hit is None:
                return None
            self.kept.move_to_end(key)
            return hit[0]

    def put(self, key: _Key, facts: dict[str, Any]) -> None:
        weight = 256 + sum(len(k) + (len(v) if isinstance(v, str) else 8) for k, v in facts.items())
        with self.lock:
            old = self.kept.pop(key, None)
            self.held += weight - (old[1] if old is not None else 0)
            self.kept[key] = (facts, weight)
            while len(self.kept) > self.entries or self.held > self.size:
                _, (_, dropped) = self.kept.popitem(last=False)
                self.held -= dropped


_cache = _Cache(CACHE_ENTRIES, _CACHE_BYTES)


def gguf_facts(path: Path) -> dict[str, Any]:
    """The file's scalar metadata (`general.architecture`, `llama.context_length`, …); {} for
    a file that cannot be read as GGUF, or is not a regular file."""
    try:
        # O_NONBLOCK: opening a FIFO waits for a writer that may never come. The opened file
        # is what is checked and read (fstat, not a stat of the path before the open).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        try:
            st = os.fstat(fd)
        except OSError:
            return {}
        if not stat.S_ISREG(st.st_mode):
            return {}
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        facts = _cache.get(key)
        if facts is None:
            facts = _parse(f)
            _cache.put(key, facts)
    return facts
