"""The prompt cache's pure parts: the shared-prefix search the scheduler runs for every slot
and saved state, and the disk tier's file checks (nothing reaches llama.cpp unchecked)."""

from __future__ import annotations

import random

from lmsp.engine.prompt_cache import CacheEntry, PromptCache, common_prefix, worth_restoring
from lmsp.engine.prompt_disk import DiskEntry, DiskTier


def test_common_prefix_matches_a_token_loop():
    rng = random.Random(7)
    for _ in range(500):
        a = [rng.randrange(4) for _ in range(rng.randrange(0, 60))]
        b = a[: rng.randrange(0, len(a) + 1)] + [rng.randrange(4) for _ in range(rng.randrange(0, 20))]
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        assert common_prefix(a, b) == n == common_prefix(b, a)


def test_a_restore_must_save_more_than_it_costs():
    assert worth_restoring(600, 650)
    assert not worth_restoring(4, 10)  # too few tokens saved to bother
    assert not worth_restoring(10, 4000)  # restoring 4,000 tokens to save 10


def test_disk_entries_survive_a_reopen_and_a_damaged_or_foreign_file_is_never_loaded(tmp_path):
    tokens = list(range(100))
    state = bytearray(random.Random(1).randbytes(5000))
    disk = DiskTier(tmp_path, "m:1", "model-a", 1 << 20)
    assert disk.write(tokens, state)
    longer = DiskTier(tmp_path, "m:1", "model-a", 1 << 20)
    (entry,) = longer.entries.values()
    assert entry.tokens == tokens and longer.load(entry) == state
    (disk.folder / "other.lmkv").write_bytes(b"not a state file")
    # Another model file (or the same one changed): every state is stale and deleted.
    assert DiskTier(tmp_path, "m:1", "model-b", 1 << 20).entries == {}
    assert not entry.path.exists() and (disk.folder / "other.lmkv").exists()
    # A flipped byte in the state: the CRC finds it at load, and the file goes.
    disk = DiskTier(tmp_path, "m:1", "model-a", 1 << 20)
    assert disk.write(tokens, state)
    (entry,) = disk.entries.values()
    raw = bytearray(entry.path.read_bytes())
    raw[-1] ^= 1
    entry.path.write_bytes(raw)
    assert disk.load(entry) is None and not entry.path.exists() and disk.entries == {}
    # A truncated file is refused when the folder is read.
    assert disk.write(tokens, state)
    (entry,) = disk.entries.values()
    entry.path.write_bytes(entry.path.read_bytes()[:-10])
    assert DiskTier(tmp_path, "m:1", "model-a", 1 << 20).entries == {}


def test_the_disk_budget_drops_the_least_recently_used(tmp_path):
    disk = DiskTier(tmp_path, "m", "id", 3 * 1500)  # a file: 1,000 bytes of state, ~400 of header and tokens
    for i in range(5):
        assert disk.write([i] * 50, bytearray(1000))
    assert sorted(e.tokens[0] for e in disk.entries.values()) == [2, 3, 4]
    assert disk.bytes <= 3 * 1500
    assert not disk.write([9] * 50, bytearray(5000))  # larger than the whole budget


def test_a_state_is_found_only_in_its_own_cache_scope(tmp_path):
    """Issue 38: the same tokens saved in two scopes are two entries, in memory and on disk,
    and a prompt is only ever matched against its own scope's."""
    tokens = list(range(100))
    disk = DiskTier(tmp_path, "m:1", "model-a", 1 << 20)
    assert disk.write(tokens, bytearray(b"a" * 500), "alice")
    assert disk.write(tokens, bytearray(b"b" * 500), "bob")
    reopened = DiskTier(tmp_path, "m:1", "model-a", 1 << 20)
    assert sorted(e.scope for e in reopened.entries.values()) == ["alice", "bob"]
    cache = PromptCache(1 << 20, disk=reopened)
    cache._insert(CacheEntry(tokens[:80], bytearray(b"m" * 100), scope="carol"))
    entry, n = cache.lookup(tokens + [7], "bob")
    assert entry is not None and n == 100 and entry.scope == "bob"
    assert isinstance(entry, DiskEntry) and reopened.load(entry) == bytearray(b"b" * 500)
    found, n = cache.lookup(tokens, "carol")
    assert isinstance(found, CacheEntry) and n == 80
    assert cache.lookup(tokens, "dave") == (None, 0)
    assert cache.lookup(tokens) == (None, 0)  # "" is a scope like any other
