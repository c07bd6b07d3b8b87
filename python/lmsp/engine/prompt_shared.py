"""The prompt cache's shared tier (`serve --cache-shared DIR`): prompt states in a folder that
several servers use (replicas behind a balancer, on one machine or several over a network
filesystem), so that a conversation's next turn restores its past on whichever one it lands.

Files are prompt_file.py's, in one folder per model identity, and that identity is the
model's content (its GGUF's SHA-256, model_digest.py) with the llama.cpp build and KV layout
that made the state: two machines with the same model share, another model or build never
sees the files. Until the digest is known (hashed in the background at load) the tier is not
used.

A state is written at the end of a turn (the scheduler saves it; this tier's thread writes it,
so the decode never waits on a filesystem) under a name that is the hash of the identity, the
cache scope and the turn's prompt tokens cut to a multiple of `KEY_TOKENS`. A next turn's
prompt starts with the last one's, so a look-up hashes its own prompt at every such boundary,
from the longest down, and opens the first file that exists: a few hashes and failed opens,
no listing, no index that other servers would have to keep in step. What it finds is checked
as a local file is (identity, scope, tokens and their hash, length, CRC), and then compared
with the prompt token by token.

Several servers write and delete in the folder at once, so: a file appears whole or not at
all (temp + rename in the folder); one that fails a check is deleted only if its name still
names the very file that failed (another server may have just replaced it), one without the
magic or of another identity is left alone; the byte budget is kept by whoever writes,
least recently used first (a restore touches the file's mtime), so any server may evict.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import queue
import stat
import threading
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

from ..observability.engine import ModelStats
from .model_digest import ContentDigest
from .prompt_cache import common_prefix
from .prompt_file import (
    DAMAGED,
    SUFFIX,
    Foreign,
    OtherModel,
    encode_header,
    open_file,
    read_header,
    read_state,
    write_file,
)

__all__ = ["KEY_TOKENS", "SharedEntry", "SharedTier"]

log = logging.getLogger(__name__)

# A file is named by its prompt's tokens cut to a multiple of this: a look-up tries one name per
# multiple its prompt holds (128 for a full 8,192-token window).
KEY_TOKENS = 64
# States saved but not yet written; beyond it a turn's state is not shared (a slow filesystem
# must not grow the process without bound).
MAX_PENDING_BYTES = 1 << 30
# A temporary file older than this is what a crashed writer left; younger, one being written.
TMP_STALE = 3600.0


@dataclass(eq=False)
class SharedEntry:
    path: Path
    tokens: list[int]
    scope: str
    shared: int  # how many first tokens of the prompt it was found for it holds


class SharedTier:
    def __init__(
        self,
        root: Path,
        digest: ContentDigest,
        runtime: str,
        budget_bytes: int,
        stats: ModelStats | None = None,
        max_age: float = 0.0,
    ) -> None:
        """`runtime`: what else a state depends on (llama.cpp's build, the KV layout): part of
        the identity. `max_age` as the disk tier's (the store's retention)."""
        self.root = root
        self.budget = budget_bytes
        self.max_age = max_age
        self._digest = digest
        self._runtime = runtime
        self._stats = stats
        self._identity: str | None = None
        self._folder: Path | None = None
        self._queue: queue.Queue[tuple[array[int], bytearray, str, int] | None] = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._writer: threading.Thread | None = None

    def ready(self) -> bool:
        """Whether the model's digest is known and the folder usable: until then the tier is
        neither read nor written."""
        if self._folder is not None:
            return True
        digest = self._digest.value
        if digest is None:
            return False
        identity = f"sha256:{digest}|{self._runtime}"
        folder = self.root / hashlib.sha256(identity.encode()).hexdigest()[:32]
        try:
            for path in (self.root, folder):
                path.mkdir(mode=0o700, exist_ok=True)
                if not stat.S_ISDIR(os.lstat(path).st_mode):  # a link: never followed
                    raise OSError(f"{path} is not a folder")
        except OSError as exc:
            log.warning("prompt cache: no shared tier in %s (%s)", self.root, exc)
            self._digest.value = None  # not asked again: the tier stays off
            return False
        self._identity, self._folder = identity, folder
        return True

    def _names(self, tokens: bytes, scope: str) -> list[tuple[int, str]]:
        """(n, the file name of a prompt cut to n tokens) for every multiple n of KEY_TOKENS the
        tokens hold, shortest first."""
        assert self._identity is not None
        h = hashlib.sha256(b"\0".join((self._identity.encode(), scope.encode("utf-8", "surrogateescape"), b"")))
        names = []
        step = 4 * KEY_TOKENS
        for end in range(step, len(tokens) + 1, step):
            h.update(tokens[end - step : end])
            names.append((end // 4, h.hexdigest()[:32] + SUFFIX))
        return names

    def lookup(self, prompt: list[int], scope: str, have: int) -> SharedEntry | None:
        """A state of `scope` holding a longer start of `prompt` than `have` tokens, the
        longest the names find; None when there is none (or the tier is not ready)."""
        if not self.ready():
            return None
        assert self._folder is not None and self._identity is not None
        for n, name in reversed(self._names(array("i", prompt).tobytes(), scope)):
            if n <= have:
                break
            path = self._folder / name
            try:
                with open_file(path) as f:
                    try:
                        header = read_header(f, self._identity)
                    except DAMAGED as exc:
                        self._drop_damaged(path, f.fileno(), exc)
                        continue
            except (FileNotFoundError, Foreign, OtherModel):
                continue  # none, or not ours to judge: left alone
            except OSError as exc:
                log.info("prompt cache: shared %s unreadable (%s)", name, exc)
                continue
            tokens = header.tokens.tolist()
            shared = common_prefix(tokens, prompt)
            if header.scope != scope or shared < n:  # a name's hash collision, or a planted file
                self._refused()
                continue
            return SharedEntry(path, tokens, scope, shared)
        return None

    def load(self, entry: SharedEntry) -> bytearray | None:
        """The entry's state, every check passed and still the tokens the look-up saw (another
        server may have replaced the file since); None otherwise."""
        assert self._identity is not None
        try:
            with open_file(entry.path) as f:
                try:
                    header = read_header(f, self._identity)
                    if header.scope != entry.scope or header.tokens.tolist() != entry.tokens:
                        return None  # replaced since: a miss, the new file is someone's
                    state = read_state(f, header)
                except DAMAGED as exc:
                    self._drop_damaged(entry.path, f.fileno(), exc)
                    return None
            with contextlib.suppress(OSError):
                os.utime(entry.path, follow_symlinks=False)  # most recently used, for every server
        except (OSError, Foreign, OtherModel):
            return None
        return state

    def _drop_damaged(self, path: Path, fd: int, exc: BaseException) -> None:
        """Deletes a file that failed a check, if its name still names that very file: a
        file renamed over it by another server since is whole, and stays."""
        self._refused()
        log.warning("prompt cache: shared %s is unusable (%s)", path.name, exc)
        with contextlib.suppress(OSError):
            mine, now = os.fstat(fd), os.lstat(path)
            if (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino):
                path.unlink()

    def _refused(self) -> None:
        if self._stats is not None:
            self._stats.shared_refused += 1

    def put(self, tokens: list[int], state: bytearray, scope: str, key_tokens: int) -> bool:
        """Queues a state for the writer thread; `key_tokens`: how many first tokens a later
        prompt surely repeats (the turn's prompt), which name it. False when it is not kept."""
        if self._folder is None or key_tokens < KEY_TOKENS:
            return False
        with self._lock:
            if self._pending + len(state) > MAX_PENDING_BYTES:
                return False
            self._pending += len(state)
        if self._writer is None:
            self._writer = threading.Thread(target=self._write_loop, name="lmsp-shared-cache", daemon=True)
            self._writer.start()
        self._queue.put((array("i", tokens), state, scope, key_tokens))
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Writes what is queued (within `timeout`), then ends the writer thread."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout)
            self._writer = None

    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            tokens, state, scope, key_tokens = item
            try:
                self._write(tokens, state, scope, key_tokens)
            except Exception:  # a failing filesystem costs the share, never the server
                log.exception("prompt cache: writing a shared state failed")
            finally:
                with self._lock:
                    self._pending -= len(state)

    def _write(self, tokens: array[int], state: bytearray, scope: str, key_tokens: int) -> None:
        assert self._folder is not None and self._identity is not None
        header = encode_header(self._identity, scope, tokens, state)
        names = self._names(tokens[:key_tokens].tobytes(), scope)
        if not names:
            return
        try:
            write_file(self._folder / names[-1][1], header, tokens, state)
        except OSError as exc:
            log.warning("prompt cache: could not write a shared state (%s)", exc)
            return
        # The same conversation's earlier turns: this state holds all they did.
        for _, name in names[:-1]:
            self._drop_if_within(self._folder / name, tokens)
        self._fit()
        if self._stats is not None:  # last: a write counted is a folder in budget
            self._stats.shared_writes += 1

    def _drop_if_within(self, path: Path, tokens: array[int]) -> None:
        assert self._identity is not None
        try:
            with open_file(path) as f:
                older = read_header(f, self._identity).tokens
        except (OSError, Foreign, OtherModel, *DAMAGED):
            return
        if len(older) <= len(tokens) and tokens[: len(older)] == older:
            with contextlib.suppress(OSError):
                path.unlink()

    def _fit(self) -> None:
        """Keeps the folder (every server's files) within the budget and the age bound, least
        recently used first; counts what it holds."""
        assert self._folder is not None
        now = time.time()
        files: list[tuple[float, int, str]] = []
        with os.scandir(self._folder) as it:
            for item in it:
                if not item.is_file(follow_symlinks=False):
                    continue
                try:
                    st = item.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile (another server's eviction)
                if item.name.endswith(".tmp"):
                    if now - st.st_mtime > TMP_STALE:
                        with contextlib.suppress(OSError):
                            os.unlink(item.path)
                        continue
                elif not item.name.endswith(SUFFIX):
                    continue
                files.append((st.st_mtime, st.st_size, item.path))
        files.sort()
        total = sum(size for _, size, _ in files)
        cut = now - self.max_age if self.max_age > 0 else float("-inf")
        evicted = 0
        for used, size, path in files:
            if total <= self.budget and used >= cut:
                break
            if path.endswith(".tmp"):
                continue  # being written by someone
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                evicted += 1
            total -= size
        if self._stats is not None:
            self._stats.shared_evictions += evicted
            self._stats.shared_bytes = total
