"""engine.gguf: a store's header reads (for /api/tags, /api/show and --max-loaded-bytes) do not
wait on what is not a regular file, stop at their bounds, and read each file once (issue 38)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lmsp.engine.gguf import gguf_facts
from lmsp.engine.registry import ModelEntry
from lmsp.faces.ollama.models import tags_entry
from model_stores import tiny_gguf

ARCH = "general.architecture"


def _within(seconds: float, call: Callable[[], Any]) -> tuple[bool, Any]:
    """`call()` on a thread of its own: (whether it ended within `seconds`, its result). One
    that hangs is left behind as a daemon (the test fails, and the process still ends)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), result[0] if result else None


@pytest.fixture()
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO named as a model in a model store; a reader left waiting on it is let go after."""
    path = tmp_path / "store" / "Fifo-7B.Q4_0.gguf"
    path.parent.mkdir()
    os.mkfifo(path)
    yield path
    try:  # a writer that opens and closes ends a blocked reader's open with EOF
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # no reader waits: the fix held


def test_a_fifo_in_the_store_gives_no_facts_at_once(fifo):
    ended, facts = _within(5, lambda: gguf_facts(fifo))
    assert ended, "reading a FIFO's header waited for a writer"
    assert facts == {}
    # /api/tags's entry for it: listed, with no details, at once.
    ended, entry = _within(5, lambda: tags_entry("fifo:7b-q4_0", ModelEntry("fifo:7b-q4_0", fifo)))
    assert ended and entry["details"]["family"] == "" and entry["size"] == 0


def test_a_fifo_swapped_in_for_a_found_file_gives_no_facts_at_once(tmp_path):
    path = tiny_gguf(tmp_path / "store" / "Swap-7B.Q4_0.gguf", {ARCH: "llama"})
    assert gguf_facts(path) == {ARCH: "llama"}
    path.unlink()
    os.mkfifo(path)
    try:
        ended, facts = _within(5, lambda: gguf_facts(path))
        assert ended and facts == {}
    finally:
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass
    # A device behind a link: no facts either (nothing but a regular file is read).
    link = tmp_path / "store" / "Zero.gguf"
    link.symlink_to("/dev/zero")
    assert gguf_facts(link) == {}


def test_a_header_declaring_endless_strings_is_not_read_to_its_end(tmp_path):
    """A sparse file of 4 GiB whose header declares 2^40 strings: each read as an empty one,
    skipping them would take a worker thread's hours. The facts before it are kept."""
    path = tiny_gguf(tmp_path / "Sparse.gguf", {ARCH: "llama"}, arrays={"tokenizer.ggml.tokens": 1 << 40})
    os.truncate(path, 4 << 30)
    ended, facts = _within(10, lambda: gguf_facts(path))
    assert ended, "the header's array was skipped item by item past any bound"
    assert facts == {ARCH: "llama"}


def test_a_store_of_a_hundred_models_is_read_once(tmp_path):
    """`/api/tags` twice over 100 models (more than the 64 the cache once held): the second
    listing parses no header. Each file is rewritten in place between the two, same size and
    time: a header parsed again would tell the new family, a kept one the old."""
    store = tmp_path / "store"
    paths = [tiny_gguf(store / f"m{i:03d}-1B.Q4_0.gguf", {ARCH: "aaaa"}) for i in range(100)]
    entries = [ModelEntry(f"m{i:03d}:1b-q4_0", p) for i, p in enumerate(paths)]
    first = [tags_entry(e.id, e)["details"]["family"] for e in entries]
    assert first == ["aaaa"] * 100
    for path in paths:
        st = path.stat()
        tiny_gguf(path, {ARCH: "bbbb"})
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert path.stat().st_ino == st.st_ino and path.stat().st_size == st.st_size
    second = [tags_entry(e.id, e)["details"]["family"] for e in entries]
    parsed_again = second.count("bbbb")
    assert parsed_again == 0, f"the second listing parsed {parsed_again} of 100 headers again"


def test_a_file_changed_in_place_is_read_again(tmp_path):
    path = tiny_gguf(tmp_path / "Grow-1B.Q4_0.gguf", {ARCH: "aaaa"})
    assert gguf_facts(path)[ARCH] == "aaaa"
    tiny_gguf(path, {ARCH: "llama-longer"})  # another size: another identity
    assert gguf_facts(path)[ARCH] == "llama-longer"
