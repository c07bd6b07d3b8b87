"""Counting grammar compiles and the engine's cache hits, for the request's model.

The engine's cache (lmsp-constrain's `Vocabulary`) tells only how many grammars it holds, so a
compile is told from a hit by whether that number grew. Each model compiles on one thread of its
own, so nothing else changes the number in between. Once the cache is full (64 grammars),
neither a hit nor an evicting compile changes it: those are counted as `full_cache`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .exchange import current

__all__ = ["CACHE_CAPACITY", "compile_counted", "count_compile", "rejection_counter"]

CACHE_CAPACITY = 64  # lmsp-constrain's CACHE_ENTRIES


def compile_counted(vocabulary: Any, compile_fn: Callable[[str], Any], text: str) -> tuple[Any, str]:
    """Runs on the model's compile thread: the compiled grammar and what it came to."""
    before = vocabulary.cached_grammars
    compiled = compile_fn(text)
    if vocabulary.cached_grammars > before:
        return compiled, "compiled"
    return compiled, "full_cache" if before >= CACHE_CAPACITY else "cached"


def count_compile(outcome: str) -> None:
    """On the event loop, in the request that asked for the grammar."""
    exchange = current()
    if exchange is not None and exchange.metrics is not None:
        exchange.metrics.grammar(exchange.model, outcome)


def rejection_counter() -> Callable[[str], None] | None:
    """On the event loop, in the request whose output is checked: what counts a finished value
    the check refused, by kind (`lmsp_schema_check_rejections`), on whichever thread ends it."""
    exchange = current()
    if exchange is None or exchange.metrics is None:
        return None
    metrics, model = exchange.metrics, exchange.model
    return lambda kind: metrics.schema_rejected(model, kind)
