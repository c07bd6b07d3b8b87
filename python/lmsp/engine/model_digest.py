"""A model file's content identity: the SHA-256 of the GGUF's bytes, for a prompt state shared
between machines (prompt_shared.py), where a path, a size and a modification time say nothing.

Hashing a model of gigabytes takes seconds to minutes: it runs once, on a thread of its own
(never on the serving path, nor before the server starts), and its result is memoized in the
data folder keyed by the file's (device, inode, size, mtime_ns), so that a restart reads it back
at once. Until it is known `value` is None, and the shared tier is not used.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path

import orjson

__all__ = ["ContentDigest", "file_key"]

log = logging.getLogger(__name__)

MEMO = "model-digests.json"
# Memoized digests kept; the oldest beyond go (a model replaced often leaves its old keys).
MEMO_MAX = 256
_CHUNK = 1 << 20


def file_key(path: Path) -> str:
    """What the file is now, for the memo: a changed file (another inode, size or mtime) is
    hashed again."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


class ContentDigest:
    """The SHA-256 of a model file's content, computed on a background thread (`start`)."""

    _memo_lock = threading.Lock()  # two models of one process share the memo file

    def __init__(self, model_path: Path, memo_dir: Path | None) -> None:
        self.path = model_path
        self.memo = memo_dir / MEMO if memo_dir is not None else None
        self.value: str | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        key = file_key(self.path)
        known = self._read_memo().get(key)
        if isinstance(known, str) and len(known) == 64:
            self.value = known
            return
        self._thread = threading.Thread(target=self._compute, args=(key,), name="lmsp-model-digest", daemon=True)
        self._thread.start()

    def wait(self, timeout: float | None = None) -> str | None:
        """For tests and tools: the digest once computed (None if it is not after `timeout`)."""
        if self._thread is not None:
            self._thread.join(timeout)
        return self.value

    def _compute(self, key: str) -> None:
        h = hashlib.sha256()
        try:
            with open(self.path, "rb") as f:
                while chunk := f.read(_CHUNK):  # hashlib releases the GIL on large buffers
                    h.update(chunk)
            if file_key(self.path) != key:  # changed while read: its digest is of no one file
                log.warning("prompt cache: %s changed while hashed; no shared tier", self.path)
                return
        except OSError as exc:
            log.warning("prompt cache: cannot hash %s (%s); no shared tier", self.path, exc)
            return
        self.value = h.hexdigest()
        self._write_memo(key, self.value)

    def _read_memo(self) -> dict[str, object]:
        if self.memo is None:
            return {}
        try:
            data = orjson.loads(self.memo.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_memo(self, key: str, digest: str) -> None:
        if self.memo is None:
            return
        with self._memo_lock:
            memo = self._read_memo()
            memo.pop(key, None)
            memo[key] = digest  # last: the newest
            while len(memo) > MEMO_MAX:
                memo.pop(next(iter(memo)))
            tmp: str | None = None
            try:
                self.memo.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(suffix=".tmp", prefix=".digests-", dir=self.memo.parent)
                with os.fdopen(fd, "wb") as f:
                    f.write(orjson.dumps(memo))
                os.replace(tmp, self.memo)
            except OSError as exc:  # the digest is still known to this process
                log.warning("prompt cache: cannot keep the model digest in %s (%s)", self.memo, exc)
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp)
