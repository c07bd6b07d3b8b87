"""Prompt-lookup drafts (engine/drafts.py): what an n-gram match proposes."""

from __future__ import annotations

import pytest

from lmsp.engine.drafts import NgramDrafter


def test_the_tokens_after_the_last_match_are_proposed() -> None:
    drafter = NgramDrafter([1, 2, 3, 4, 5, 6, 9, 1, 2, 3])
    assert drafter.draft(3) == [4, 5, 6]
    assert drafter.draft(10) == [4, 5, 6, 9, 1, 2, 3]


def test_the_history_end_never_matches_itself() -> None:
    assert NgramDrafter([7, 8, 9]).draft(4) == []
    assert NgramDrafter([]).draft(4) == []


def test_the_longest_match_wins_over_a_more_recent_shorter_one() -> None:
    # "2 3" last occurred followed by 8, but "1 2 3" (three tokens) is followed by 4.
    drafter = NgramDrafter([1, 2, 3, 4, 0, 2, 3, 8, 1, 2, 3])
    assert drafter.draft(2) == [4, 0]


def test_the_most_recent_occurrence_of_equal_length_wins() -> None:
    drafter = NgramDrafter([5, 6, 1, 5, 6, 2, 5, 6])
    assert drafter.draft(1) == [2]


def test_shorter_ngrams_are_tried_down_to_min_n() -> None:
    history = [4, 9, 7, 3]  # no token occurs twice: nothing to look up
    assert NgramDrafter(history).draft(2) == []
    history = [3, 1, 2, 9, 3]  # "9 3" and "2 9 3" never occurred; "3" did, followed by 1
    assert NgramDrafter(history).draft(2) == [1, 2]
    assert NgramDrafter(history, min_n=2).draft(2) == []


def test_extend_keeps_the_index_current() -> None:
    drafter = NgramDrafter([10, 11, 12, 13])
    assert drafter.draft(2) == []
    drafter.extend([10])
    assert drafter.draft(2) == [11, 12]
    drafter.extend([11, 12])
    assert drafter.draft(5) == [13, 10, 11, 12]
    assert len(drafter) == 7


def test_a_run_of_one_token_proposes_more_of_it() -> None:
    drafter = NgramDrafter([1, 1, 1])
    assert drafter.draft(4) == [1]  # what followed the occurrence that ends one before


def test_k_zero_proposes_nothing_and_bad_lengths_are_refused() -> None:
    assert NgramDrafter([1, 2, 1]).draft(0) == []
    with pytest.raises(ValueError):
        NgramDrafter(max_n=1, min_n=2)
