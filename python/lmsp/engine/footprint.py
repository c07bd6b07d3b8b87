"""How much memory a model will take once loaded, told from its files before loading it, for
`--max-loaded-bytes`: its weights (the GGUF files' sizes: llama.cpp maps or copies them whole)
plus its KV cache (every slot's full window, f16 keys and values, as the backend sizes it).

An estimate: llama.cpp's compute buffers and the prompt cache (`--cache-ram`, bounded on its
own) are left out. A header that cannot be read gives no KV term rather than an error; the
load then reports what is wrong with the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .backends import auto_parallel, memory_bytes
from .discovery import shards
from .gguf import gguf_facts

__all__ = ["estimate_bytes", "kv_bytes_per_token"]

F16_BYTES = 2


def kv_bytes_per_token(facts: Mapping[str, Any]) -> int:
    """KV-cache bytes one token takes in every layer: layers × kv heads × (key + value head
    dims) × 2 bytes; 0 when the header does not say (per-layer head counts, a missing key)."""
    arch = facts.get("general.architecture")
    keys = ("block_count", "attention.head_count", "embedding_length")
    shape: list[Any] = [facts.get(f"{arch}.{key}") for key in keys]
    kv_heads = facts.get(f"{arch}.attention.head_count_kv", shape[1])  # absent: no grouped-query attention
    if not all(_count(v) for v in (*shape, kv_heads)):
        return 0
    layers, heads, embd = (int(v) for v in shape)
    key = facts.get(f"{arch}.attention.key_length", embd // heads)
    value = facts.get(f"{arch}.attention.value_length", embd // heads)
    if not (_count(key) and _count(value)):
        return 0
    return int(layers) * int(kv_heads) * (int(key) + int(value)) * F16_BYTES


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def estimate_bytes(path: Path, *, ctx_per_sequence: int, n_parallel: int) -> int:
    """The model at `path` (a split's first shard: all its shards count) loaded with this
    window per sequence and this many slots (0: chosen from memory, as the backend does)."""
    weights = 0
    for shard in shards(path):
        try:
            weights += shard.stat().st_size
        except OSError:
            pass
    facts = gguf_facts(path)
    per_token = kv_bytes_per_token(facts)
    trained = facts.get(f"{facts.get('general.architecture')}.context_length")
    window = min(ctx_per_sequence, trained) if isinstance(trained, int) and trained > 0 else ctx_per_sequence
    parallel = n_parallel or auto_parallel(per_token * window, memory_bytes())
    return weights + per_token * window * parallel
