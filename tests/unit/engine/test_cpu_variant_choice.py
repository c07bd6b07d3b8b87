"""Which CPU variant lmsp loads (engine/cpu_variants.py, issue 48): the best this CPU runs,
never one that uses AMX unless LMSP_ALLOW_AMX=1 asks for it (a VM whose kernel granted the tile
state still faulted in that variant's mul_mat)."""

from __future__ import annotations

from pathlib import Path

from lmsp.engine.cpu_variants import Candidate, choose


def _variants(*rows: tuple[str, int, bool]) -> list[Candidate]:
    return [Candidate(tag, Path(f"libggml-cpu-{tag}.so"), score, amx) for tag, score, amx in rows]


LEVELS = _variants(
    ("x64", 1, False),
    ("sse42", 3, False),
    ("haswell", 99, False),
    ("skylakex", 0, False),  # this CPU has no AVX-512: the variant scores itself 0
    ("sapphirerapids", 400, True),
)


def test_the_highest_score_among_the_runnable_wins():
    best, why = choose(LEVELS[:4], amx_allowed=False)
    assert best is not None and best.tag == "haswell"
    assert why == "the best of the 3 of 4 variants this CPU runs"


def test_an_amx_variant_is_passed_over_unless_asked_for_and_says_so():
    best, why = choose(LEVELS, amx_allowed=False)
    assert best is not None and best.tag == "haswell"
    assert "sapphirerapids passed over: AMX, used only with LMSP_ALLOW_AMX=1" in why


def test_an_amx_variant_is_taken_where_the_user_asks_for_it():
    best, _ = choose(LEVELS, amx_allowed=True)
    assert best is not None and best.tag == "sapphirerapids"


def test_no_runnable_variant_is_said():
    best, why = choose(_variants(("haswell", 0, False), ("skylakex", 0, False)), amx_allowed=False)
    assert best is None
    assert why == "none of the 2 CPU variants runs on this CPU"


def test_a_variant_named_by_lmsp_cpu_variant_is_taken_if_this_cpu_runs_it():
    best, why = choose(LEVELS, amx_allowed=False, wanted="sse42")
    assert best is not None and best.tag == "sse42"
    assert why == "LMSP_CPU_VARIANT=sse42, one of the 4 of 5 variants this CPU runs"
    best, why = choose(LEVELS, amx_allowed=False, wanted="skylakex")  # scores 0 here
    assert best is None
    assert why.startswith("LMSP_CPU_VARIANT=skylakex is not one of the 4 of 5 variants this CPU runs (x64, sse42")
