"""Prompt-lookup drafts (engine/drafts.py): what an n-gram match proposes, and how much."""

from __future__ import annotations

import pytest

from lmsp.engine.drafts import NgramDrafter


def test_the_tokens_after_the_last_match_are_proposed_half_as_many_as_matched() -> None:
    # "1 2 3 4" recurs at the end (4 tokens matched): 2 of what followed it.
    drafter = NgramDrafter([1, 2, 3, 4, 5, 6, 7, 9, 1, 2, 3, 4])
    assert drafter.draft(8) == [5, 6]
    assert drafter.draft(1) == [5]


def test_a_longer_match_drafts_longer_up_to_k() -> None:
    text = list(range(20, 40))
    drafter = NgramDrafter([*text, 0, *text[:12]])  # 12 tokens matched: 6 drafted
    assert drafter.draft(8) == text[12:18]
    drafter.extend(text[12:16])  # the copy goes on: 16 matched
    assert drafter.draft(8) == [*text[16:], 0, *text[:3]]
    assert drafter.draft(3) == text[16:19]


def test_the_history_end_never_matches_itself() -> None:
    assert NgramDrafter([7, 8, 9]).draft(4) == []
    assert NgramDrafter([]).draft(4) == []


def test_the_longest_match_wins_over_a_more_recent_shorter_one() -> None:
    # "2 3" last occurred followed by 8, but "1 2 3" (three tokens) is followed by 4.
    drafter = NgramDrafter([1, 2, 3, 4, 0, 2, 3, 8, 1, 2, 3])
    assert drafter.draft(2) == [4]


def test_the_most_recent_occurrence_of_equal_length_wins() -> None:
    drafter = NgramDrafter([5, 6, 1, 5, 6, 2, 5, 6])
    assert drafter.draft(1) == [2]


def test_shorter_ngrams_are_tried_down_to_min_n() -> None:
    history = [4, 9, 7, 3]  # no token occurs twice: nothing to look up
    assert NgramDrafter(history).draft(2) == []
    history = [3, 1, 2, 9, 3, 1]  # "9 3 1" never occurred; "3 1" did, followed by 2
    assert NgramDrafter(history).draft(2) == [2]
    assert NgramDrafter(history, min_n=3).draft(2) == []


def test_a_single_token_match_proposes_nothing() -> None:
    assert NgramDrafter([3, 1, 2, 9, 3]).draft(4) == []
    assert NgramDrafter([3, 1, 2, 9, 3], min_n=1).draft(4) == []  # half of one token


def test_extend_keeps_the_index_current() -> None:
    drafter = NgramDrafter([10, 11, 12, 13, 14])
    assert drafter.draft(2) == []
    drafter.extend([10, 11])
    assert drafter.draft(2) == [12]
    drafter.extend([12, 13])
    assert drafter.draft(5) == [14, 10]
    assert len(drafter) == 9


def test_a_run_of_one_token_proposes_more_of_it() -> None:
    drafter = NgramDrafter([1, 1, 1, 1, 1])
    assert drafter.draft(4) == [1]  # "1 1 1" matched one token earlier, 4 tokens back


def test_k_zero_proposes_nothing_and_bad_lengths_are_refused() -> None:
    assert NgramDrafter([1, 2, 1, 2]).draft(0) == []
    with pytest.raises(ValueError):
        NgramDrafter(max_n=1, min_n=2)
