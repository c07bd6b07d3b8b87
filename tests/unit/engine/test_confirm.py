"""A load re-confines the file discovery found (engine.discovery.confirm): the link it came
through still leads to the same regular file, inside its store. Real files and links in a
temporary folder; the reasons name no path (a client reads them)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmsp.engine.discovery import Moved, confirm
from lmsp.engine.registry import discover


def _found(folder: Path) -> dict[str, tuple[Path, Path, tuple[int, int], Path | None]]:
    return {
        e.id: (e.path, e.real, e.identity, e.root)
        for e in discover([folder], include_embedded=False, from_stores=False)
        if e.real is not None and e.identity is not None
    }


@pytest.fixture
def store(tmp_path: Path) -> Path:
    (tmp_path / "models" / "blobs").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "models" / "blobs" / "a.bin").write_bytes(b"GGUF" + b"\0" * 64)
    (tmp_path / "outside" / "Other.gguf").write_bytes(b"GGUF" + b"\1" * 64)
    os.symlink("blobs/a.bin", tmp_path / "models" / "Linked.gguf")
    (tmp_path / "models" / "Plain.gguf").write_bytes(b"GGUF" + b"\2" * 64)
    return tmp_path


def _refused(entry: tuple[Path, Path, tuple[int, int], Path | None], reason: str) -> None:
    with pytest.raises(Moved, match=reason) as caught:
        confirm(*entry)
    assert os.sep not in str(caught.value)


def test_a_file_as_found_is_confirmed(store):
    found = _found(store / "models")
    assert set(found) == {"linked:latest", "plain:latest"}
    assert found["linked:latest"][1] == (store / "models" / "blobs" / "a.bin").resolve()
    for entry in found.values():
        confirm(*entry)


def test_a_link_repointed_outside_after_discovery_is_refused(store):
    entry = _found(store / "models")["linked:latest"]
    link = store / "models" / "Linked.gguf"
    link.unlink()
    os.symlink(store / "outside" / "Other.gguf", link)
    _refused(entry, "leads elsewhere")


def test_a_file_swapped_for_a_link_is_refused(store):
    entry = _found(store / "models")["plain:latest"]
    plain = store / "models" / "Plain.gguf"
    plain.unlink()
    os.symlink(store / "outside" / "Other.gguf", plain)
    _refused(entry, "leads elsewhere")


def test_a_file_replaced_in_place_is_refused(store):
    entry = _found(store / "models")["plain:latest"]
    plain = store / "models" / "Plain.gguf"
    other = store / "models" / "new.tmp"
    other.write_bytes(b"GGUF" + b"\3" * 64)
    other.replace(plain)  # same path, another inode
    _refused(entry, "replaced")


def test_a_fifo_or_a_vanished_file_is_refused_without_waiting(store):
    entry = _found(store / "models")["plain:latest"]
    plain = store / "models" / "Plain.gguf"
    plain.unlink()
    os.mkfifo(plain)  # opened without blocking, then seen for what it is
    _refused(entry, "no longer a regular file")
    plain.unlink()
    _refused(entry, "gone")


def test_a_store_file_must_lie_in_its_store(store):
    path, real, identity, _ = _found(store / "models")["plain:latest"]
    confirm(path, real, identity, store / "models")
    _refused((path, real, identity, store / "outside"), "outside its store")
