"""How a step shares its prompt budget among the prompts being read (engine/scheduler.py)."""

from __future__ import annotations

from lmsp.engine.scheduler import prompt_chunks


def test_short_prompts_read_together_get_equal_chunks():
    # Next turns whose past was restored: one pass over the weights a step, the shortest
    # done after the first.
    assert prompt_chunks([18, 19, 20, 25], 256) == [18, 18, 18, 18]


def test_prompts_that_do_not_fit_go_shortest_first():
    assert prompt_chunks([330] * 8, 512) == [330, 182, 0, 0, 0, 0, 0, 0]
    assert prompt_chunks([200, 400], 256) == [200, 56]


def test_one_prompt_takes_the_whole_budget():
    assert prompt_chunks([1000], 256) == [256]
    assert prompt_chunks([], 256) == []
