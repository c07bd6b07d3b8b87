"""The prompt cache's pure parts: the shared-prefix search the scheduler runs for every slot
and saved state, and the disk tier's file checks (nothing reaches llama.cpp unchecked)."""

from __future__ import annotations

import hashlib
import os
import random
import stat
import time
from array import array
from pathlib import Path

from lmsp.engine.prompt_cache import CacheEntry, PromptCache, common_prefix, worth_restoring
from lmsp.engine.prompt_disk import (
    STALE_AFTER,
    VERSION,
    DiskEntry,
    DiskTier,
    forget_owner_files,
    join_scope,
    scope_owner,
)


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
    # Another model file (or the same one changed): never loaded, and left to its own server.
    assert DiskTier(tmp_path, "m:1", "model-b", 1 << 20).entries == {}
    assert entry.path.exists() and (disk.folder / "other.lmkv").exists()
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


# --- the folder is private, and shared only with servers of other models (issue 38) ----------


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path, follow_symlinks=False).st_mode)


def test_files_are_0600_in_a_0700_folder_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        disk = DiskTier(tmp_path / "cache", "m", "id", 1 << 20)
        assert disk.write(list(range(64)), bytearray(100))
    finally:
        os.umask(old)
    (entry,) = disk.entries.values()
    assert _mode(entry.path) == 0o600
    assert _mode(disk.folder) == 0o700 and _mode(tmp_path / "cache") == 0o700
    assert [p.name for p in disk.folder.iterdir()] == [entry.path.name]  # no temporary file left


def test_a_link_planted_at_a_predictable_name_is_never_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    disk = DiskTier(tmp_path / "cache", "m", "id", 1 << 20)
    tokens = list(range(64))
    # The names a write used to make: the tokens' hash, then .tmp beside it.
    name = hashlib.sha256(b"\0" + array("i", tokens).tobytes()).hexdigest()[:32]
    (disk.folder / f"{name}.tmp").symlink_to(victim)
    assert disk.write(tokens, bytearray(b"x" * 100))
    assert victim.read_bytes() == b"precious"
    (entry,) = disk.entries.values()
    assert not entry.path.is_symlink()


def test_a_link_in_the_folder_is_neither_loaded_nor_deleted(tmp_path: Path) -> None:
    elsewhere = DiskTier(tmp_path / "elsewhere", "m", "id", 1 << 20)
    assert elsewhere.write(list(range(64)), bytearray(100))
    (target,) = elsewhere.entries.values()
    disk = DiskTier(tmp_path / "cache", "m", "id", 1 << 20)
    link = disk.folder / "planted.lmkv"
    link.symlink_to(target.path)
    reopened = DiskTier(tmp_path / "cache", "m", "id", 1 << 20)
    assert reopened.entries == {}
    assert link.is_symlink() and target.path.exists()


def test_two_model_identities_sharing_a_folder_keep_each_others_files(tmp_path: Path) -> None:
    # Two servers, one cache folder, the same model name but different model files.
    a = DiskTier(tmp_path, "m", "model-a", 3 * 1500)
    assert a.write(list(range(64)), bytearray(1000))
    (mine,) = a.entries.values()
    b = DiskTier(tmp_path, "m", "model-b", 3 * 1500)
    assert b.entries == {} and mine.path.exists()
    for i in range(5):  # B's budget evicts B's own files only
        assert b.write([i + 1000] * 64, bytearray(1000))
    assert mine.path.exists()
    assert b.write(list(range(64)), bytearray(1000))  # the same tokens: another file
    assert a.load(mine) == bytearray(1000)
    again = DiskTier(tmp_path, "m", "model-a", 3 * 1500)
    assert [e.path for e in again.entries.values()] == [mine.path]


def test_another_identitys_file_unused_for_a_week_is_deleted(tmp_path: Path) -> None:
    a = DiskTier(tmp_path, "m", "model-a", 1 << 20)
    assert a.write(list(range(64)), bytearray(100))
    (old,) = a.entries.values()
    week_ago = time.time() - STALE_AFTER - 60
    os.utime(old.path, (week_ago, week_ago))
    DiskTier(tmp_path, "m", "model-b", 1 << 20)
    assert not old.path.exists()


def test_an_entry_unused_past_the_retention_is_deleted(tmp_path: Path) -> None:
    # Issue 38: the disk tier keeps a prompt no longer than the store keeps a response.
    disk = DiskTier(tmp_path, "m", "id", 1 << 20, max_age=3600)
    assert disk.write(list(range(64)), bytearray(100))
    assert disk.write(list(range(100, 164)), bytearray(100))
    old, recent = disk.entries.values()
    hour_ago = time.time() - 3700
    os.utime(old.path, (hour_ago, hour_ago))
    reopened = DiskTier(tmp_path, "m", "id", 1 << 20, max_age=3600)
    assert [e.path for e in reopened.entries.values()] == [recent.path] and not old.path.exists()
    # While serving: found past it at the next look-up, before anything is restored.
    (entry,) = reopened.entries.values()
    entry.used = hour_ago
    cache = PromptCache(0, disk=reopened)
    assert cache.lookup(list(range(100, 164))) == (None, 0)
    assert not recent.path.exists() and reopened.bytes == 0
    # Without a bound (a retention of 0: for ever), nothing goes for its age.
    kept = DiskTier(tmp_path / "forever", "m", "id", 1 << 20)
    assert kept.write(list(range(64)), bytearray(100))
    (entry,) = kept.entries.values()
    entry.used = 0.0
    assert kept.expire() == 0 and entry.path.exists()


# --- a DELETE reaches every state of its owner (issue 38) -------------------------------------


def test_an_owners_states_are_forgotten_in_memory_and_on_every_models_disk(tmp_path: Path) -> None:
    """A DELETE by owner A drops A's states under every cache salt, in memory, on this model's
    disk tier and in the files of any other model identity or model folder; B's stay, and so
    do a shared scope's (no owner), files not ours and links."""
    a, a_salted, b = join_scope("ka", ""), join_scope("ka", "s1"), join_scope("kb", "")
    shared_salted = join_scope("", "s1")
    assert scope_owner(a) == scope_owner(a_salted) == "ka" and scope_owner(shared_salted) == ""
    assert join_scope("", "") == "" and scope_owner("") == ""
    tokens = list(range(64))
    disk = DiskTier(tmp_path, "m:1", "model-a", 1 << 20)
    for i, scope in enumerate((a, a_salted, b, shared_salted)):
        assert disk.write([*tokens, i], bytearray(200), scope)
    cache = PromptCache(1 << 20, disk=disk)
    cache._insert(CacheEntry(tokens, bytearray(b"m" * 100), scope=a_salted))
    cache._insert(CacheEntry(tokens, bytearray(b"n" * 100), scope=b))
    # Another model's folder, and another identity of this model (a server not running now).
    other = DiskTier(tmp_path, "m:2", "model-b", 1 << 20)
    assert other.write(tokens, bytearray(200), a) and other.write(tokens, bytearray(200), b)
    elsewhere = DiskTier(tmp_path, "m:1", "model-a-changed", 1 << 20)
    assert elsewhere.write(tokens, bytearray(200), a_salted)
    (disk.folder / "other.lmkv").write_bytes(b"not a state file")
    os.symlink(next(iter(other.entries)), disk.folder / "link.lmkv")

    assert cache.forget_owner("ka") == 3  # one in memory, two on this disk tier
    assert {e.scope for e in cache._entries.values()} == {b} and cache.bytes == 100
    assert {e.scope for e in disk.entries.values()} == {b, shared_salted}
    assert cache.lookup([*tokens, 0], a) == (None, 0) and cache.lookup(tokens, a_salted) == (None, 0)
    assert forget_owner_files(tmp_path, "ka") == 2  # the other model's and the other identity's
    left = sorted(p.name for p in tmp_path.rglob("*.lmkv"))
    assert len(left) == 5  # b and the shared one here, b on the other model, the foreign file, the link
    assert (disk.folder / "other.lmkv").exists() and (disk.folder / "link.lmkv").is_symlink()
    assert {e.scope for e in DiskTier(tmp_path, "m:2", "model-b", 1 << 20).entries.values()} == {b}
    assert forget_owner_files(tmp_path, "ka") == 0 and forget_owner_files(tmp_path, "") == 0
    assert forget_owner_files(tmp_path / "none", "ka") == 0
    assert cache.forget_owner("") == 0 and len(cache) == 1


def test_a_file_of_an_older_format_is_deleted_at_open(tmp_path: Path) -> None:
    # Version 2's scope hid its owner: a DELETE could not find it, so it is not kept.
    disk = DiskTier(tmp_path, "m", "id", 1 << 20)
    assert disk.write(list(range(64)), bytearray(100), join_scope("ka", ""))
    (entry,) = disk.entries.values()
    raw = bytearray(entry.path.read_bytes())
    raw[8:12] = (VERSION - 1).to_bytes(4, "little")
    entry.path.write_bytes(raw)
    assert DiskTier(tmp_path, "m", "id", 1 << 20).entries == {} and not entry.path.exists()
