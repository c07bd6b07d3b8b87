"""The shared prompt tier's format and identity (engine/prompt_shared.py, model_digest.py):
two tiers on one folder stand for two servers; what one writes the other finds, by the
content of the model, never across scopes or identities, and nothing damaged is restored."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from lmsp.engine.model_digest import MEMO, ContentDigest
from lmsp.engine.prompt_file import FIXED
from lmsp.engine.prompt_shared import KEY_TOKENS, SharedTier
from lmsp.observability.engine import ModelStats


def digest_of(model: Path, memo: Path | None = None) -> ContentDigest:
    d = ContentDigest(model, memo)
    d.start()
    assert d.wait(30) is not None
    return d


def tier(root: Path, model: Path, budget: int = 1 << 30, runtime: str = "rt") -> tuple[SharedTier, ModelStats]:
    stats = ModelStats()
    t = SharedTier(root, digest_of(model), runtime, budget, stats)
    assert t.ready()
    return t, stats


def prompt(n: int, seed: int = 0) -> list[int]:
    return [(i * 7 + seed) % 5000 for i in range(n)]


def write(t: SharedTier, tokens: list[int], scope: str = "a.", key: int | None = None, size: int = 1000) -> None:
    state = bytearray(os.urandom(size))
    assert t.put(tokens, state, scope, key if key is not None else len(tokens) - 5)
    t.close()  # waits for the writer


def files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.lmkv"))


def test_the_digest_is_the_contents_sha256_memoized_by_the_files_identity(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(os.urandom(3 << 20))
    memo = tmp_path / "data"
    d = digest_of(model, memo)
    assert d.value == hashlib.sha256(model.read_bytes()).hexdigest()
    assert (memo / MEMO).exists()
    again = ContentDigest(model, memo)
    again.start()
    assert again.value == d.value and again._thread is None  # read back, not hashed again
    # A copy elsewhere (another machine's path) has the same content identity.
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(model.read_bytes())
    assert digest_of(copy).value == d.value
    # Rewritten in place (another mtime): hashed again, and to its new content.
    model.write_bytes(os.urandom(1 << 20))
    changed = digest_of(model, memo)
    assert changed.value == hashlib.sha256(model.read_bytes()).hexdigest() != d.value


def test_what_one_server_writes_another_restores_within_its_scope_only(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    other_path = tmp_path / "elsewhere.gguf"  # the same model on another machine
    other_path.write_bytes(model.read_bytes())
    one, stats = tier(tmp_path / "shared", model)
    two, _ = tier(tmp_path / "shared", other_path)
    past = prompt(300)
    write(one, past)
    assert stats.shared_writes == 1
    (path,) = files(tmp_path / "shared")
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    nxt = past + [11, 12, 13] * 10
    found = two.lookup(nxt, "a.", 0)
    assert found is not None and found.shared == 300
    assert two.load(found) is not None
    assert two.lookup(nxt, "b.", 0) is None  # another owner
    assert two.lookup(nxt, "a.salt", 0) is None  # another cache salt
    assert two.lookup(nxt, "a.", 300) is None  # nothing longer than what the slots hold
    assert two.lookup(prompt(300, seed=1), "a.", 0) is None  # another conversation
    # Another model (or another llama.cpp build) never sees the files.
    different = tmp_path / "other.gguf"
    different.write_bytes(b"other weights" * 1000)
    stranger, _ = tier(tmp_path / "shared", different)
    assert stranger.lookup(nxt, "a.", 0) is None
    rebuilt, _ = tier(tmp_path / "shared", model, runtime="another build")
    assert rebuilt.lookup(nxt, "a.", 0) is None


def test_a_damaged_file_is_refused_and_deleted_a_foreign_one_left(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    one, _ = tier(tmp_path / "shared", model)
    two, stats = tier(tmp_path / "shared", model)
    past = prompt(200)
    nxt = past + [1] * 40
    for damage in ("state", "truncate", "tokens"):
        write(one, past)
        (path,) = files(tmp_path / "shared")
        raw = bytearray(path.read_bytes())
        if damage == "state":
            raw[-10] ^= 0xFF
        elif damage == "truncate":
            raw = raw[:-100]
        else:
            n_header = int.from_bytes(raw[12:16], "little")
            raw[FIXED.size + n_header + 8] ^= 0x01
        path.write_bytes(bytes(raw))
        refused = stats.shared_refused
        found = two.lookup(nxt, "a.", 0)
        if found is not None:  # the header and tokens are whole: the state is read on load
            assert two.load(found) is None
        assert stats.shared_refused == refused + 1
        assert not path.exists(), damage
    # Not ours (no magic), or a link: left alone, never read.
    write(one, past)
    (path,) = files(tmp_path / "shared")
    path.write_bytes(b"somebody else's file")
    assert two.lookup(nxt, "a.", 0) is None and path.exists()
    path.unlink()
    target = tmp_path / "target"
    target.write_bytes(b"x")
    path.symlink_to(target)
    assert two.lookup(nxt, "a.", 0) is None and path.is_symlink()


def test_a_damaged_file_replaced_meanwhile_is_not_deleted(tmp_path):
    """Another server renamed a whole file over the name after this one opened a bad one."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    one, _ = tier(tmp_path / "shared", model)
    write(one, prompt(200))
    (path,) = files(tmp_path / "shared")
    fresh = path.read_bytes()
    with open(path, "rb") as old:
        os.unlink(path)
        path.write_bytes(fresh)  # a new inode under the name
        one._drop_damaged(path, old.fileno(), ValueError("test"))
    assert path.read_bytes() == fresh


def test_the_folder_keeps_its_budget_least_recently_used_first(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    one, stats = tier(tmp_path / "shared", model, budget=5 * 20_000)
    pasts = [prompt(KEY_TOKENS * 2, seed=s) for s in range(4)]
    for past in pasts:
        write(one, past, size=20_000)
    assert len(files(tmp_path / "shared")) == 4
    # The first is restored (touched): the second is now the least recently used.
    time.sleep(0.02)
    found = one.lookup(pasts[0] + [1] * 10, "a.", 0)
    assert found is not None and one.load(found) is not None
    write(one, prompt(KEY_TOKENS * 2, seed=9), size=20_000)
    write(one, prompt(KEY_TOKENS * 2, seed=10), size=20_000)
    left = {one.lookup(p + [1] * 10, "a.", 0) is not None for p in pasts[1:3]}
    assert left == {False}
    assert one.lookup(pasts[0] + [1] * 10, "a.", 0) is not None
    assert stats.shared_evictions == 2
    assert stats.shared_bytes == sum(p.stat().st_size for p in files(tmp_path / "shared")) <= 5 * 20_000


def test_a_later_turn_replaces_its_conversations_earlier_states(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"weights" * 1000)
    one, _ = tier(tmp_path / "shared", model)
    turn1 = prompt(150)
    write(one, turn1)
    write(one, turn1 + [3] * 200)
    (path,) = files(tmp_path / "shared")
    found = one.lookup(turn1 + [3] * 200 + [4] * 20, "a.", 0)
    assert found is not None and found.shared == 350
