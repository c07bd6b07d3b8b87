"""The prompt cache's disk tier (`serve --cache-dir`): saved sequence states as files, so that a
conversation continued after a restart restores its past instead of reading it again.

One folder per model under the cache folder. A file is a header, the tokens and llama.cpp's
state; nothing is handed to llama.cpp before the header has been checked: the magic, the
format version, the model file's identity (its path, size and modification time: a changed
model makes every file stale), the cache scope it may be restored in (whose prompt it was), the
tokens' hash and the state's CRC. A file without the magic is not ours and is left alone,
and so is one made for another model identity (two servers may share a folder: neither deletes
the other's, issue 38) until no server has used it for `STALE_AFTER`; one of ours that fails a
check is deleted. The folder is kept under a byte budget, least recently used (file
modification time) first out. A scope is "<owner key>.<salt key>" (join_scope): a DELETE by an
owner finds every file of that owner, of every model identity (forget_owner_files).

The files hold prompts: the folders are 0700 and the files 0600, each written to a fresh
temporary name (O_EXCL) then renamed into place, and no path in the folder is followed through
a symbolic link (one there is left alone), so that another local user can neither read a
prompt nor aim a write at a file of their choosing.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

from .prompt_file import (
    DAMAGED,
    MAGIC,
    SUFFIX,
    VERSION,
    Foreign,
    OtherModel,
    encode_header,
    file_size,
    header_scope,
    open_file,
    read_header,
    read_state,
    write_file,
)

__all__ = [
    "MAGIC",
    "VERSION",
    "DiskEntry",
    "DiskTier",
    "forget_owner_files",
    "join_scope",
    "model_identity",
    "scope_owner",
]

log = logging.getLogger(__name__)

# Another model identity's file unused (its modification time) for this long is deleted: the
# model file it was made for has changed or gone, and no server will read it again.
STALE_AFTER = 7 * 86400.0


def model_identity(path: Path) -> str:
    """What a saved state is only valid for: this model file as it is now."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"


def join_scope(owner_key: str, salt_key: str) -> str:
    """A cache scope (GenerationRequest.cache_scope) from its two opaque keys, either may be
    empty: whose prompt it was (none when the operator shares the cache) and its cache_salt.
    The owner's part stays readable so that a DELETE reaches every state of that owner
    (`scope_owner`, issue 38); "" when both are empty (one scope shared by all)."""
    if "." in owner_key:
        raise ValueError("an owner key has no '.'")
    return f"{owner_key}.{salt_key}" if owner_key or salt_key else ""


def scope_owner(scope: str) -> str:
    """The owner key a scope was made with (join_scope); "" for one of no owner."""
    return scope.partition(".")[0]


@dataclass(eq=False)
class DiskEntry:
    tokens: list[int]
    path: Path
    size: int
    # Only a prompt of this scope may restore it (GenerationRequest.cache_scope).
    scope: str = ""
    # When it was last written or restored (Unix seconds; its file's modification time).
    used: float = 0.0


class DiskTier:
    def __init__(self, folder: Path, model_name: str, identity: str, budget_bytes: int, max_age: float = 0.0) -> None:
        """`max_age`: seconds an entry is kept unused (0: no bound), the store's retention: a
        prompt's state outlives its last use by no longer than a stored response outlives its
        creation (issue 38)."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_name)[:64]
        self.folder = folder / f"{safe}-{hashlib.sha256(model_name.encode()).hexdigest()[:8]}"
        self.identity = identity
        self.budget = budget_bytes
        self.max_age = max_age
        self.entries: dict[Path, DiskEntry] = {}
        self.bytes = 0
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        with contextlib.suppress(OSError):  # one made before by a looser umask: ours, so tightened
            os.chmod(self.folder, 0o700, follow_symlinks=False)
        found: list[DiskEntry] = []
        for path in self.folder.glob(f"*{SUFFIX}"):
            entry = self._read_header(path)
            if entry is not None:
                entry.used = os.stat(path, follow_symlinks=False).st_mtime
                found.append(entry)
        for entry in sorted(found, key=lambda e: e.used):  # oldest first: the LRU order
            self.entries[entry.path] = entry
            self.bytes += entry.size
        self.expire()
        self._fit(0)

    def expire(self) -> int:
        """Deletes the entries unused for longer than `max_age`; returns how many. The LRU
        order puts them first: a look at the head is all it costs when none is due."""
        if self.max_age <= 0:
            return 0
        cut, gone = time.time() - self.max_age, 0
        while self.entries:
            oldest = next(iter(self.entries.values()))
            if oldest.used >= cut:
                break
            self.remove(oldest)
            gone += 1
        return gone

    def _read_header(self, path: Path) -> DiskEntry | None:
        """The entry a file holds, or None: a foreign file (not ours, another model identity's,
        a link) is skipped, a stale or broken one of ours deleted."""
        try:
            with open_file(path) as f:
                header = read_header(f, self.identity)
        except Foreign:
            return None
        except OtherModel:
            self._forget_if_stale(path)
            return None
        except (OSError, *DAMAGED) as exc:
            log.info("prompt cache: dropping %s (%s)", path.name, exc)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return DiskEntry(header.tokens.tolist(), path, header.size, header.scope)

    def _forget_if_stale(self, path: Path) -> None:
        """Another model identity's file: left for the server it belongs to, unless none has
        used it for STALE_AFTER."""
        with contextlib.suppress(OSError):
            if time.time() - os.stat(path, follow_symlinks=False).st_mtime > STALE_AFTER:
                log.info("prompt cache: dropping %s (another model's, unused)", path.name)
                path.unlink()

    def load(self, entry: DiskEntry) -> bytearray | None:
        """The state of an entry, its checks passed; None (and the file gone) otherwise."""
        try:
            with open_file(entry.path) as f:
                header = read_header(f, self.identity)
                if header.scope != entry.scope or header.tokens.tolist() != entry.tokens:
                    raise ValueError("header changed")
                state = read_state(f, header)
            os.utime(entry.path, follow_symlinks=False)  # most recently used
            entry.used = time.time()
        except (Foreign, OtherModel):  # replaced since it was read (a link, another server's): not ours to delete
            self.entries.pop(entry.path, None)
            self.bytes -= entry.size
            return None
        except (OSError, *DAMAGED) as exc:
            log.warning("prompt cache: %s is unusable (%s); deleted", entry.path.name, exc)
            self.remove(entry)
            return None
        self.entries[entry.path] = self.entries.pop(entry.path, entry)
        return state

    def write(self, tokens: list[int], state: bytearray, scope: str = "") -> bool:
        """Saves a state of a prompt of `scope`; entries whose tokens start this one are
        removed (it holds them)."""
        toks = array("i", tokens)
        header = encode_header(self.identity, scope, toks, state)
        size = file_size(len(header), len(toks), len(state))
        if size > self.budget:
            return False
        self._fit(size)
        # The same tokens in two scopes are two files; so are they for two model identities (two
        # servers sharing the folder never write over each other's files).
        key = b"\0".join((self.identity.encode("utf-8", "surrogateescape"), scope.encode("utf-8", "surrogateescape")))
        name = hashlib.sha256(key + b"\0" + toks.tobytes()).hexdigest()
        path = self.folder / f"{name[:32]}{SUFFIX}"
        try:
            write_file(path, header, toks, state)
        except OSError as exc:
            log.warning("prompt cache: could not write %s (%s)", path, exc)
            return False
        old = self.entries.pop(path, None)
        if old is not None:
            self.bytes -= old.size
        self.entries[path] = DiskEntry(list(tokens), path, size, scope, time.time())
        self.bytes += size
        self.expire()
        return True

    def remove(self, entry: DiskEntry) -> None:
        with contextlib.suppress(OSError):
            entry.path.unlink()  # an entry is a file this tier read or wrote: its own identity
        if self.entries.pop(entry.path, None) is not None:
            self.bytes -= entry.size

    def forget_owner(self, owner_key: str) -> int:
        """Deletes every entry of that owner's scopes (all its cache salts); returns how many."""
        if not owner_key:
            return 0
        gone = [e for e in self.entries.values() if scope_owner(e.scope) == owner_key]
        for entry in gone:
            self.remove(entry)
        return len(gone)

    def _fit(self, incoming: int) -> None:
        while self.entries and self.bytes + incoming > self.budget:
            self.remove(next(iter(self.entries.values())))


def forget_owner_files(root: Path, owner_key: str) -> int:
    """Deletes every file of that owner's scopes under the cache folder `root`, for every
    model identity and every model folder (a model not loaded now, another server's sharing
    the folder: a DELETE reaches them all, issue 38); returns how many. Only files with our
    magic and a header naming that owner go; links, other files and unreadable ones stay.
    A loaded model's tier forgets its entries on its own thread first (Scheduler.forget_owner):
    this pass is for the rest, and for what that one could not reach."""
    if not owner_key:
        return 0
    gone = 0
    try:
        folders = [d for d in os.scandir(root) if d.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return 0
    for folder in folders:
        try:
            files = [f for f in os.scandir(folder.path) if f.name.endswith(SUFFIX)]
        except OSError as exc:
            log.warning("prompt cache: cannot list %s (%s)", folder.path, exc)
            continue
        for file in files:
            path = Path(file.path)
            if _header_owner(path) == owner_key:
                try:
                    path.unlink()
                    gone += 1
                except FileNotFoundError:
                    pass
    return gone


def _header_owner(path: Path) -> str | None:
    """The owner key of a file's scope, whatever its model identity; None when it is not one
    of ours (no magic, a link, not a regular file) or names no scope."""
    scope = header_scope(path)
    return scope_owner(scope) if scope is not None else None
