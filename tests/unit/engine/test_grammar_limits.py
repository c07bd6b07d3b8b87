"""Grammar failure paths that need no model (lmsp/engine/grammar.py, the Rust constraint): a
compile past its budget is an unsupported grammar, and a constraint takes no address from the
public API nor a logits row of the wrong length."""

from __future__ import annotations

import asyncio
import threading

import numpy
import pytest

from lmsp._core import GrammarError, Vocabulary
from lmsp.engine.grammar import GrammarCompiler, UnsupportedGrammar


class _BlockingVocabulary:
    """A compile that outlasts any budget (a hostile schema), without burning a core."""

    cached_grammars = 0  # read around each compile, to tell a compile from a cache hit

    def __init__(self) -> None:
        self.release = threading.Event()

    def compile_json_schema(self, schema: str) -> None:
        self.release.wait(10)
        raise GrammarError("released")


def test_a_compile_past_its_budget_is_an_unsupported_grammar():
    # On Python 3.10, wait_for's timeout is asyncio.TimeoutError, which was a 500 there.
    vocabulary = _BlockingVocabulary()
    compiler = GrammarCompiler(vocabulary, budget_s=0.05)  # type: ignore[arg-type]
    try:
        with pytest.raises(UnsupportedGrammar, match="longer than 0.05 s"):
            asyncio.run(compiler.json_schema({"type": "object"}))
    finally:
        vocabulary.release.set()
        compiler.close()


def test_a_constraint_takes_no_address_from_the_public_api_nor_a_row_of_the_wrong_length():
    vocabulary = Vocabulary([b"a", b"b", "<eos>"], [2])
    constraint = vocabulary.compile_lark('start: "a"').start(temperature=0.0, seed=1, min_p=0.0)
    assert not hasattr(constraint, "step")
    row = numpy.zeros(3, dtype=numpy.float32)
    with pytest.raises(ValueError, match="4 entries; the grammar's vocabulary has 3"):
        constraint._step_at(row.ctypes.data, 4)  # it would have read past the row
    assert constraint._step_at(row.ctypes.data, 3) == (0, True)
