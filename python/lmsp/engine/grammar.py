"""Grammars for constrained decoding: one compiler per model, on the Rust constraint engine.

Compiling takes milliseconds (a hostile schema, much longer), so it runs on a thread of its
own per model, never on the event loop or the scheduler, within a wall-clock budget. The
engine's own limits bound what an abandoned compile can still cost; a bounded queue keeps a
flood of distinct schemas from piling up work.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from lmsp._core import CompiledGrammar, GrammarError, Vocabulary

from ..observability.grammar import compile_counted, count_compile
from .llama import LlamaModel
from .schema_check import schema_text
from .sequence import Overloaded

__all__ = ["GrammarCompiler", "UnsupportedGrammar"]

# The corpus median compiles in under a millisecond and the largest real schemas in tens;
# past this, a schema costs more than it is worth to a local service.
DEFAULT_BUDGET_S = 1.0
# Compiles waiting for the model's compile thread; past it, new ones are refused at once.
MAX_PENDING = 8
# A schema may not demand more repetitions than any output could hold (minItems: 100000
# compiles in microseconds, then can never finish).
MAX_REPEAT = 4096
_MIN_KEYWORDS = ("minItems", "minLength", "minProperties", "minContains")
_REPEAT_COUNT = re.compile(r"\{(\d+)")


class UnsupportedGrammar(ValueError):
    """A grammar the engine cannot enforce in time or at all; the message says why."""


class GrammarCompiler:
    def __init__(self, vocabulary: Vocabulary, *, budget_s: float = DEFAULT_BUDGET_S) -> None:
        self.vocabulary = vocabulary
        self.budget_s = budget_s
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmsp-grammar")
        self._pending = 0

    @classmethod
    def for_model(cls, model: LlamaModel, *, fast_forward: bool = False) -> GrammarCompiler:
        """Builds the model's vocabulary (~0.2 s for 49k tokens): once, when it loads.
        `fast_forward`: its grammars force text in runs (engine/fastforward.py); without it,
        every output token is one the model chose (among those the grammar allows)."""
        return cls(Vocabulary(model.token_table(), model.end_tokens(), fast_forward=fast_forward))

    async def json_schema(self, schema: Mapping[str, Any]) -> CompiledGrammar:
        _check_bounds(schema)
        return await self._compile(self.vocabulary.compile_json_schema, schema_text(schema))

    async def lark(self, grammar: str) -> CompiledGrammar:
        return await self._compile(self.vocabulary.compile_lark, grammar)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)

    async def _compile(self, compile_fn: Any, text: str) -> CompiledGrammar:
        if self._pending >= MAX_PENDING:
            raise Overloaded(detail="too many schemas are being compiled for this model; retry later")
        self._pending += 1
        future = asyncio.wrap_future(self._thread.submit(compile_counted, self.vocabulary, compile_fn, text))
        try:
            # On timeout the future is cancelled: a compile that has not started never runs.
            compiled: CompiledGrammar
            compiled, outcome = await asyncio.wait_for(future, self.budget_s)
            count_compile(outcome)
            return compiled
        # Python 3.10's wait_for raises asyncio.TimeoutError, not yet the builtin one.
        except (TimeoutError, asyncio.TimeoutError):
            count_compile("refused")
            raise UnsupportedGrammar(f"the schema took longer than {self.budget_s:g} s to compile") from None
        except GrammarError as exc:
            count_compile("refused")
            raise UnsupportedGrammar(str(exc)) from None
        finally:
            self._pending -= 1


def _check_bounds(schema: Any, path: str = "") -> None:
    """Refuses lower bounds no output could meet (the engine compiles them lazily, so they
    would only fail once the output ran out of room)."""
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in _MIN_KEYWORDS and isinstance(value, int) and value > MAX_REPEAT:
                raise UnsupportedGrammar(f"{key} {value} at {path or '/'} is over the limit of {MAX_REPEAT}")
            if key == "pattern" and isinstance(value, str):
                counts = [int(n) for n in _REPEAT_COUNT.findall(value)]
                if counts and max(counts) > MAX_REPEAT:
                    raise UnsupportedGrammar(
                        f"pattern repeats {max(counts)} times at {path or '/'}, over the limit of {MAX_REPEAT}"
                    )
            _check_bounds(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            _check_bounds(value, f"{path}/{i}")
