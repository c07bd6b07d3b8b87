"""How a step shares its prompt budget among the prompts being read (engine/scheduler.py)."""

from __future__ import annotations

from lmsp.engine.scheduler import PROMPT_GROUP, prompt_chunks


def test_prompts_are_read_whole_one_after_another():
    # A burst of chat turns: each prompt's first token waits for the ones before it only.
    assert prompt_chunks([48] * 8, 512) == [48, 0, 0, 0, 0, 0, 0, 0]
    assert prompt_chunks([330] * 8, 512) == [330, 0, 0, 0, 0, 0, 0, 0]


def test_short_prompts_share_a_step_up_to_the_group():
    assert PROMPT_GROUP == 32
    assert prompt_chunks([5, 6, 7, 20, 25], 256) == [5, 6, 7, 20, 0]
    assert prompt_chunks([18, 19, 20, 25], 256) == [18, 19, 0, 0]


def test_a_prompt_longer_than_the_budget_gets_the_budget():
    assert prompt_chunks([1000], 256) == [256]
    assert prompt_chunks([10, 1000], 256) == [10, 246]
    assert prompt_chunks([], 256) == []
