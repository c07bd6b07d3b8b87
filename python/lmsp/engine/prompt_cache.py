"""KV cells kept beyond the slots: when a slot is about to be reused for another prompt, what it
held is saved here (llama.cpp's per-sequence state), keyed by its tokens and its cache scope
(whose prompt it was: an entry is only ever matched by a prompt of the same scope, and a DELETE
by its owner drops it: `forget_owner`), in host
memory under a byte budget, least recently used first out. A later prompt of that scope that
starts with those tokens gets them restored instead of decoded again: on a CPU restoring costs
about 1/100 of decoding (docs/operations/prompt-cache.md has the figures).

Owned by the scheduler's thread; the metrics read its sizes from another thread (plain ints).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from ..observability.engine import ModelStats
from .llama import Context
from .prompt_disk import DiskEntry, DiskTier, scope_owner

__all__ = ["CacheEntry", "PromptCache", "common_prefix", "worth_restoring"]

# Prompts shorter than this are not worth an entry: decoding them takes a few steps.
MIN_TOKENS = 32
# Restoring an entry costs about its length / RESTORE_RATIO decoded prompt tokens. Measured on
# the embedded model on 2 cores: 0.025-0.03 ms a token restored against 2-13 ms a token decoded
# (ratio 70-400); 32 leaves room for a GPU, where decoding is relatively cheaper.
RESTORE_RATIO = 32
# The fewest prompt tokens a restore must save over what the slots give.
RESTORE_GAIN = 8


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many first tokens `a` and `b` share. List slices compare in C: a bisection over
    them is ~20x faster than a token loop over a long shared prefix."""
    n = min(len(a), len(b))
    if n == 0 or a[0] != b[0]:
        return 0
    if a[:n] == b[:n]:
        return n
    lo, hi = 1, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def worth_restoring(gain: int, entry_tokens: int) -> bool:
    """Whether restoring an entry of `entry_tokens` beats decoding the `gain` tokens it saves."""
    return gain >= RESTORE_GAIN and gain * RESTORE_RATIO >= entry_tokens


@dataclass(eq=False)
class CacheEntry:
    tokens: list[int]
    state: bytearray
    # A file of the disk tier holds the same state: it need not be written again.
    on_disk: bool = False
    # Only a prompt of this scope may restore it (GenerationRequest.cache_scope).
    scope: str = ""


class PromptCache:
    """Saved sequence states under a byte budget; LRU order is the dict's order."""

    def __init__(self, budget_bytes: int, stats: ModelStats | None = None, disk: DiskTier | None = None) -> None:
        self.budget = budget_bytes
        self.bytes = 0
        self._entries: OrderedDict[int, CacheEntry] = OrderedDict()  # by id(), oldest first
        self._stats = stats
        self.disk = disk
        self._publish()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, prompt: list[int], scope: str = "") -> tuple[CacheEntry | DiskEntry | None, int]:
        """The entry of `scope` sharing the longest start with `prompt` (in memory, else on
        disk), and how many tokens it shares. Another scope's entries are never looked at."""
        best: CacheEntry | DiskEntry | None = None
        best_n = 0
        for entry in self._entries.values():
            if entry.scope != scope:
                continue
            n = common_prefix(entry.tokens, prompt)
            if n > best_n:
                best, best_n = entry, n
        if self.disk is not None:
            self.disk.expire()  # nothing past the retention is restored, even on an idle server
            for disk_entry in self.disk.entries.values():
                if disk_entry.scope != scope:
                    continue
                n = common_prefix(disk_entry.tokens, prompt)
                if n > best_n:
                    best, best_n = disk_entry, n
        return best, best_n

    def save(self, ctx: Context, seq: int, tokens: list[int], scope: str = "") -> bool:
        """Keeps what sequence `seq` holds (its cells are exactly `tokens`, a prompt of
        `scope`). An entry of the same scope that is a start of `tokens` is replaced (this one
        holds all it did); nothing is saved when one already holds all of `tokens`."""
        if len(tokens) < MIN_TOKENS or (self.budget <= 0 and self.disk is None):
            return False
        for key, entry in list(self._entries.items()):
            if entry.scope != scope:
                continue
            n = common_prefix(entry.tokens, tokens)
            if n == len(tokens):
                self._entries.move_to_end(key)
                return False
            if n == len(entry.tokens):
                self._drop(key)
        state = ctx.save_state(seq)
        if state is None:
            return False
        if len(state) > self.budget:  # straight to disk, when there is one
            self._spill(CacheEntry(list(tokens), state, scope=scope))
            return False
        self._insert(CacheEntry(list(tokens), state, scope=scope))
        if self._stats is not None:
            self._stats.cache_saves += 1
        return True

    def _insert(self, entry: CacheEntry) -> None:
        state = entry.state
        while self.bytes + len(state) > self.budget and self._entries:
            evicted = self._entries[next(iter(self._entries))]
            self._spill(evicted)  # memory's loss is the disk's gain, when there is one
            self._drop(id(evicted))
            if self._stats is not None:
                self._stats.cache_evictions += 1
        self._entries[id(entry)] = entry
        self.bytes += len(state)
        self._publish()

    def _spill(self, entry: CacheEntry) -> None:
        """Writes an entry to the disk tier, unless a file there already holds its tokens;
        files whose tokens start its tokens go (it holds all they did). Within its scope."""
        disk = self.disk
        if disk is None or entry.on_disk:
            return
        for other in list(disk.entries.values()):
            if other.scope != entry.scope:
                continue
            n = common_prefix(other.tokens, entry.tokens)
            if n == len(entry.tokens):
                entry.on_disk = True
                return
            if n == len(other.tokens):
                disk.remove(other)
        entry.on_disk = disk.write(entry.tokens, entry.state, entry.scope)
        self._publish()

    def persist(self) -> None:
        """Writes what memory holds to the disk tier, least recently used first: the disk's
        budget then drops the oldest, as memory's would have."""
        for entry in list(self._entries.values()):
            self._spill(entry)

    def restore(self, ctx: Context, entry: CacheEntry | DiskEntry, seq: int) -> bool:
        """Loads the entry's cells into sequence `seq`; on False the sequence is empty and the
        entry (which llama.cpp refused) is dropped. A state read from disk is kept in memory."""
        started = time.perf_counter()
        if isinstance(entry, DiskEntry):
            assert self.disk is not None
            state = self.disk.load(entry)
            ok = state is not None and ctx.load_state(seq, state)
            if state is None or not ok:
                self.disk.remove(entry)
            elif len(state) <= self.budget:
                self._insert(CacheEntry(entry.tokens, state, on_disk=True, scope=entry.scope))
            if self._stats is not None:
                self._stats.cache_restore_seconds += time.perf_counter() - started
            self._publish()
            return ok
        ok = ctx.load_state(seq, entry.state)
        if self._stats is not None:
            self._stats.cache_restore_seconds += time.perf_counter() - started
        key = id(entry)
        if key in self._entries:
            if ok:
                self._entries.move_to_end(key)
            else:
                self._drop(key)
        return ok

    def forget_owner(self, owner_key: str) -> int:
        """Drops every entry of that owner's scopes, in memory and on this model's disk tier
        (a DELETE by that owner, issue 38); returns how many."""
        if not owner_key:
            return 0
        keys = [k for k, e in self._entries.items() if scope_owner(e.scope) == owner_key]
        for key in keys:
            self._drop(key)
        gone = len(keys) + (self.disk.forget_owner(owner_key) if self.disk is not None else 0)
        self._publish()
        return gone

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
        self._publish()

    def _drop(self, key: int) -> None:
        entry = self._entries.pop(key)
        self.bytes -= len(entry.state)
        self._publish()

    def _publish(self) -> None:
        if self._stats is not None:
            self._stats.cache_bytes = self.bytes
            self._stats.cache_entries = len(self._entries)
            self._stats.cache_disk_bytes = self.disk.bytes if self.disk is not None else 0
