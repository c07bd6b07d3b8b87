"""--max-loaded-bytes: a model's memory told from its files before it loads (engine.footprint),
checked against what llama.cpp itself reports for the embedded model once loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmsp.engine.backends import auto_parallel, memory_bytes
from lmsp.engine.footprint import estimate_bytes, kv_bytes_per_token
from lmsp.engine.gguf import gguf_facts
from lmsp.engine.llama import LlamaModel
from lmsp.engine.registry import embedded_model_path
from lmsp.envargs import byte_size
from model_stores import tiny_gguf


@pytest.fixture(scope="module")
def embedded() -> Path:
    path = embedded_model_path()
    assert path is not None
    return path


def test_the_kv_term_is_what_llama_cpp_reports_for_the_loaded_model(embedded):
    model = LlamaModel(embedded)
    try:
        assert kv_bytes_per_token(gguf_facts(embedded)) == model.kv_bytes_per_token
    finally:
        model.close()
    # SmolLM2-135M: 30 layers x 3 kv heads x (64 + 64) head dims x 2 bytes
    assert kv_bytes_per_token(gguf_facts(embedded)) == 30 * 3 * 128 * 2


def test_the_estimate_is_the_weights_plus_every_slots_window(embedded):
    size = embedded.stat().st_size
    per_token = 30 * 3 * 128 * 2
    assert estimate_bytes(embedded, ctx_per_sequence=1024, n_parallel=1) == size + per_token * 1024
    assert estimate_bytes(embedded, ctx_per_sequence=1024, n_parallel=4) == size + per_token * 1024 * 4
    # The window is the trained context at most (8192 for this model), as the backend sizes it.
    assert estimate_bytes(embedded, ctx_per_sequence=1 << 20, n_parallel=1) == size + per_token * 8192
    # Slots chosen from memory: the backend's own choice.
    auto = auto_parallel(per_token * 1024, memory_bytes())
    assert estimate_bytes(embedded, ctx_per_sequence=1024, n_parallel=0) == size + per_token * 1024 * auto


def test_a_header_that_does_not_say_gives_the_weights_alone(tmp_path):
    shape = {"general.architecture": "x", "x.block_count": 2, "x.attention.head_count": 4, "x.embedding_length": 64}
    full = tiny_gguf(tmp_path / "full.gguf", shape)
    # No head_count_kv: every head has its keys and values; head dim 64 / 4.
    assert kv_bytes_per_token(gguf_facts(full)) == 2 * 4 * (16 + 16) * 2
    explicit = {**shape, "x.attention.head_count_kv": 1, "x.attention.key_length": 192, "x.attention.value_length": 128}
    assert kv_bytes_per_token(gguf_facts(tiny_gguf(tmp_path / "mla.gguf", explicit))) == 2 * 1 * (192 + 128) * 2
    lacking = tiny_gguf(tmp_path / "lacking.gguf", {"general.architecture": "x", "x.block_count": 2})
    assert kv_bytes_per_token(gguf_facts(lacking)) == 0
    assert estimate_bytes(lacking, ctx_per_sequence=512, n_parallel=2) == lacking.stat().st_size
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model" * 10)
    assert estimate_bytes(junk, ctx_per_sequence=512, n_parallel=2) == 110
    assert estimate_bytes(tmp_path / "gone.gguf", ctx_per_sequence=512, n_parallel=2) == 0


def test_a_split_model_counts_all_its_shards(tmp_path):
    shape = {"general.architecture": "x", "x.block_count": 1, "x.attention.head_count": 1, "x.embedding_length": 8}
    first = tiny_gguf(tmp_path / "big-00001-of-00003.gguf", shape)
    for n, size in ((2, 1000), (3, 500)):
        (tmp_path / f"big-0000{n}-of-00003.gguf").write_bytes(b"\0" * size)
    kv = 1 * 1 * (8 + 8) * 2 * 100
    assert estimate_bytes(first, ctx_per_sequence=100, n_parallel=1) == first.stat().st_size + 1500 + kv


def test_sizes_are_read_in_powers_of_1024():
    assert byte_size("0") == 0
    assert byte_size("123") == 123
    assert byte_size("800M") == 800 << 20
    assert byte_size("1.5GiB") == 3 << 29
    assert byte_size("4g") == 4 << 30
    with pytest.raises(Exception, match="not a size"):
        byte_size("lots")
