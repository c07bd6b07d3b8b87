"""One saved prompt state as a file: the format both file tiers share (the local disk tier,
prompt_disk.py, and the shared tier, prompt_shared.py).

A file is a fixed part (magic, format version, header length), a JSON header, the tokens and
llama.cpp's sequence state. The header names the model identity the state is valid for, the
cache scope it may be restored in, the tokens' count and SHA-256, and the state's length and
CRC-32: nothing is handed to llama.cpp before all of them have been checked.

Files are written to a fresh temporary name in the target folder (mkstemp: O_EXCL, mode 0600)
and renamed into place, so a reader, in this process or another, on this machine or another
over a network filesystem, sees a whole file or none; and opened without following a link nor
blocking on a FIFO (`open_file`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import struct
import tempfile
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "MAGIC",
    "SUFFIX",
    "VERSION",
    "Foreign",
    "Header",
    "OtherModel",
    "encode_header",
    "file_size",
    "header_scope",
    "open_file",
    "read_header",
    "read_state",
    "tokens_hash",
    "write_file",
]

MAGIC = b"LMSPKV\r\n"  # the CR LF catches a file mangled by a text-mode copy
# 2: the header names the entry's cache scope (a version-1 file has none, and is deleted).
# 3: the scope is "<owner key>.<salt key>" (join_scope), so that a DELETE finds every state of
# one owner; a version-2 scope hides its owner, and such a file is deleted like version 1's.
VERSION = 3
SUFFIX = ".lmkv"
FIXED = struct.Struct("<8sII")  # magic, version, header length
MAX_HEADER = 1 << 16
MAX_TOKENS = 1 << 22
# Errors that mean "this file is damaged", not "the filesystem failed".
DAMAGED = (ValueError, KeyError, TypeError, struct.error, orjson.JSONDecodeError)


class Foreign(Exception):
    """The path is a symbolic link or not a regular file, or has no magic: not ours, never
    followed, never deleted."""


class OtherModel(Exception):
    """A file of ours made for another model identity: another server's, left to it."""


@dataclass(frozen=True)
class Header:
    scope: str
    tokens: array[int]
    state_bytes: int
    state_crc32: int
    size: int  # the whole file's, as the header says it must be


def tokens_hash(tokens: array[int]) -> str:
    return hashlib.sha256(tokens.tobytes()).hexdigest()


def file_size(n_header: int, n_tokens: int, state_bytes: int) -> int:
    return FIXED.size + n_header + 4 * n_tokens + state_bytes


def read_header(f: io.BufferedReader, identity: str) -> Header:
    """Reads and checks the fixed part, the header and the tokens of an open file; the state
    follows. Raises Foreign (no magic), OtherModel, or one of DAMAGED."""
    fixed = f.read(FIXED.size)
    if len(fixed) < FIXED.size or not fixed.startswith(MAGIC):
        raise Foreign
    _, version, n_header = FIXED.unpack(fixed)
    header: Any = orjson.loads(f.read(min(n_header, MAX_HEADER)))
    if not isinstance(header, dict):
        raise ValueError("header")
    if header.get("model") != identity:
        raise OtherModel
    if version != VERSION or n_header > MAX_HEADER:
        raise ValueError(f"version {version}")
    scope = header["scope"]
    if not isinstance(scope, str):
        raise ValueError("scope")
    n_tokens = int(header["n_tokens"])
    if not 0 < n_tokens <= MAX_TOKENS:
        raise ValueError("token count")
    tokens = array("i")
    tokens.frombytes(f.read(4 * n_tokens))
    if len(tokens) != n_tokens or tokens_hash(tokens) != header["tokens_sha256"]:
        raise ValueError("tokens")
    state_bytes, crc = int(header["state_bytes"]), int(header["state_crc32"])
    size = file_size(n_header, n_tokens, state_bytes)
    if os.fstat(f.fileno()).st_size != size:
        raise ValueError("length")
    return Header(scope, tokens, state_bytes, crc, size)


def read_state(f: io.BufferedReader, header: Header) -> bytearray:
    """The state that follows the tokens, its length and CRC checked (ValueError otherwise)."""
    state = bytearray(header.state_bytes)
    if f.readinto(state) != len(state) or zlib.crc32(state) != header.state_crc32:
        raise ValueError("state damaged")
    return state


def encode_header(identity: str, scope: str, tokens: array[int], state: bytes | bytearray) -> bytes:
    return orjson.dumps(
        {
            "model": identity,
            "scope": scope,
            "n_tokens": len(tokens),
            "tokens_sha256": tokens_hash(tokens),
            "state_bytes": len(state),
            "state_crc32": zlib.crc32(state),
        }
    )


def write_file(path: Path, header: bytes, tokens: array[int], state: bytes | bytearray) -> int:
    """Writes a state (its header from `encode_header`) to `path` through a fresh temporary
    name in its folder; returns the file's size. Raises OSError (the temporary file removed)."""
    # A fresh name, created exclusively with mode 0600 (mkstemp): a predictable one could be a
    # link planted beforehand, followed by the write. The rename replaces whatever is at
    # `path`, a link included, without following it; a reader never sees half a file.
    tmp: str | None = None
    try:
        fd, tmp = tempfile.mkstemp(suffix=".tmp", prefix=".", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(FIXED.pack(MAGIC, VERSION, len(header)))
            f.write(header)
            f.write(tokens.tobytes())
            f.write(state)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise
    return file_size(len(header), len(tokens), len(state))


def open_file(path: Path) -> io.BufferedReader:
    """Opens a regular file for reading without following a link (O_NOFOLLOW), nor blocking
    on a FIFO planted in the folder (O_NONBLOCK, then checked to be a regular file)."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Foreign from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise Foreign
    return os.fdopen(fd, "rb")


def header_scope(path: Path) -> str | None:
    """The scope a file's header names, whatever its model identity; None when it is not one
    of ours (no magic, a link, not a regular file) or names none."""
    try:
        with open_file(path) as f:
            fixed = f.read(FIXED.size)
            if len(fixed) < FIXED.size or not fixed.startswith(MAGIC):
                return None
            _, _, n_header = FIXED.unpack(fixed)
            if n_header > MAX_HEADER:
                return None
            header = orjson.loads(f.read(n_header))
    except (Foreign, OSError, orjson.JSONDecodeError):
        return None
    scope = header.get("scope") if isinstance(header, dict) else None
    return scope if isinstance(scope, str) else None
