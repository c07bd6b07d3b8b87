"""The prompt cache's disk tier (`serve --cache-dir`): saved sequence states as files, so that a
conversation continued after a restart restores its past instead of reading it again.

One folder per model under the cache folder. A file is a header, the tokens and llama.cpp's
state; nothing is handed to llama.cpp before the header has been checked: the magic, the
format version, the model file's identity (its path, size and modification time: a changed
model makes every file stale), the cache scope it may be restored in (whose prompt it was), the
tokens' hash and the state's CRC. A file without the magic
is not ours and is left alone; one of ours that fails a check is deleted. The folder is kept
under a byte budget, least recently used (file modification time) first out.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import struct
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path

import orjson

__all__ = ["DiskEntry", "DiskTier", "model_identity"]

log = logging.getLogger(__name__)

MAGIC = b"LMSPKV\r\n"  # the CR LF catches a file mangled by a text-mode copy
# 2: the header names the entry's cache scope (a version-1 file has none, and is deleted).
VERSION = 2
SUFFIX = ".lmkv"
_FIXED = struct.Struct("<8sII")  # magic, version, header length
_MAX_HEADER = 1 << 16
_MAX_TOKENS = 1 << 22


def model_identity(path: Path) -> str:
    """What a saved state is only valid for: this model file as it is now."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def _tokens_hash(tokens: array[int]) -> str:
    return hashlib.sha256(tokens.tobytes()).hexdigest()


@dataclass(eq=False)
class DiskEntry:
    tokens: list[int]
    path: Path
    size: int
    # Only a prompt of this scope may restore it (GenerationRequest.cache_scope).
    scope: str = ""


class DiskTier:
    def __init__(self, folder: Path, model_name: str, identity: str, budget_bytes: int) -> None:
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name)[:64]
        self.folder = folder / f"{safe}-{hashlib.sha256(model_name.encode()).hexdigest()[:8]}"
        self.identity = identity
        self.budget = budget_bytes
        self.entries: dict[Path, DiskEntry] = {}
        self.bytes = 0
        self.folder.mkdir(parents=True, exist_ok=True)
        found: list[tuple[int, DiskEntry]] = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            entry = self._read_header(path)
            if entry is not None:
                found.append((path.stat().st_mtime_ns, entry))
        for _, entry in sorted(found, key=lambda f: f[0]):  # oldest first: the LRU order
            self.entries[entry.path] = entry
            self.bytes += entry.size
        self._fit(0)

    def _read_header(self, path: Path) -> DiskEntry | None:
        """The entry a file holds, or None: a foreign file is skipped, a stale or broken one of
        ours deleted."""
        try:
            with path.open("rb") as f:
                fixed = f.read(_FIXED.size)
                if len(fixed) < _FIXED.size or not fixed.startswith(MAGIC):
                    return None  # not ours
                _, version, n_header = _FIXED.unpack(fixed)
                if version != VERSION or n_header > _MAX_HEADER:
                    raise ValueError(f"version {version}")
                header = orjson.loads(f.read(n_header))
                if header.get("model") != self.identity:
                    raise ValueError("another model file")
                scope = header["scope"]
                if not isinstance(scope, str):
                    raise ValueError("scope")
                n_tokens = int(header["n_tokens"])
                if not 0 < n_tokens <= _MAX_TOKENS:
                    raise ValueError("token count")
                tokens = array("i")
                tokens.frombytes(f.read(4 * n_tokens))
                if len(tokens) != n_tokens or _tokens_hash(tokens) != header["tokens_sha256"]:
                    raise ValueError("tokens")
                size = path.stat().st_size
                if size != _FIXED.size + n_header + 4 * n_tokens + int(header["state_bytes"]):
                    raise ValueError("length")
        except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
            log.info("prompt cache: dropping %s (%s)", path.name, exc)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return DiskEntry(tokens.tolist(), path, size, scope)

    def load(self, entry: DiskEntry) -> bytearray | None:
        """The state of an entry, its checks passed; None (and the file gone) otherwise."""
        try:
            with entry.path.open("rb") as f:
                fixed = f.read(_FIXED.size)
                _, version, n_header = _FIXED.unpack(fixed)
                header = orjson.loads(f.read(n_header))
                if (
                    not fixed.startswith(MAGIC)
                    or version != VERSION
                    or header.get("model") != self.identity
                    or header.get("n_tokens") != len(entry.tokens)
                    or header.get("scope") != entry.scope
                ):
                    raise ValueError("header changed")
                tokens = array("i")
                tokens.frombytes(f.read(4 * len(entry.tokens)))
                if tokens.tolist() != entry.tokens:
                    raise ValueError("tokens changed")
                state = bytearray(int(header["state_bytes"]))
                if f.readinto(state) != len(state) or zlib.crc32(state) != header["state_crc32"]:
                    raise ValueError("state damaged")
            os.utime(entry.path)  # most recently used
        except (OSError, ValueError, KeyError, TypeError, struct.error, orjson.JSONDecodeError) as exc:
            log.warning("prompt cache: %s is unusable (%s); deleted", entry.path.name, exc)
            self.remove(entry)
            return None
        self.entries[entry.path] = self.entries.pop(entry.path, entry)
        return state

    def write(self, tokens: list[int], state: bytearray, scope: str = "") -> bool:
        """Saves a state of a prompt of `scope`; entries whose tokens start this one are
        removed (it holds them)."""
        toks = array("i", tokens)
        header = orjson.dumps(
            {
                "model": self.identity,
                "scope": scope,
                "n_tokens": len(toks),
                "tokens_sha256": _tokens_hash(toks),
                "state_bytes": len(state),
                "state_crc32": zlib.crc32(state),
            }
        )
        size = _FIXED.size + len(header) + 4 * len(toks) + len(state)
        if size > self.budget:
            return False
        self._fit(size)
        # The same tokens in two scopes are two files.
        name = hashlib.sha256(scope.encode("utf-8", "surrogateescape") + b"\0" + toks.tobytes()).hexdigest()
        path = self.folder / f"{name[:32]}{SUFFIX}"
        tmp = path.with_suffix(".tmp")
        try:
            with tmp.open("wb") as f:
                f.write(_FIXED.pack(MAGIC, VERSION, len(header)))
                f.write(header)
                f.write(toks.tobytes())
                f.write(state)
            os.replace(tmp, path)  # a reader never sees half a file
        except OSError as exc:
            log.warning("prompt cache: could not write %s (%s)", path, exc)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return False
        old = self.entries.pop(path, None)
        if old is not None:
            self.bytes -= old.size
        self.entries[path] = DiskEntry(list(tokens), path, size, scope)
        self.bytes += size
        return True

    def remove(self, entry: DiskEntry) -> None:
        with contextlib.suppress(OSError):
            entry.path.unlink()
        if self.entries.pop(entry.path, None) is not None:
            self.bytes -= entry.size

    def _fit(self, incoming: int) -> None:
        while self.entries and self.bytes + incoming > self.budget:
            self.remove(next(iter(self.entries.values())))
