"""The stop matcher (engine/stops.py): what goes out before a stop sequence, what is held back
while it may still begin one, across any split of the output into tokens; the same answers as
the plain matcher it replaced (one `find` per stop per token), for any stops and any split; and
a token's work that does not grow with the number of stops (issue 38), counted in calls, not
timed."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from lmsp.engine.stops import StopMatcher
from naive_stops import NaiveMatcher


def run(matcher: Any, pieces: Iterable[str]) -> list[tuple[str, bool] | str]:
    """Each feed's answer until a stop is reached, else each answer and then the flush."""
    answers: list[tuple[str, bool] | str] = []
    for piece in pieces:
        answers.append(matcher.feed(piece))
        if answers[-1][1]:
            return answers
    answers.append(matcher.flush())
    return answers


def out(stops: tuple[str, ...], pieces: list[str]) -> str:
    """What the client is sent."""
    return "".join(a if isinstance(a, str) else a[0] for a in run(StopMatcher(stops), pieces))


def test_the_text_before_a_stop_goes_out_and_nothing_after():
    assert run(StopMatcher(("END",)), ["Hello", " END", " more"]) == [("Hello", False), (" ", True)]


def test_a_stop_split_across_tokens_is_held_then_cut():
    m = StopMatcher(("</answer>",))
    assert m.feed("42</an") == ("42", False)  # `</an` may begin the stop: held back
    assert m.feed("sw") == ("", False)
    assert m.feed("er> trailing") == ("", True)


def test_held_text_that_turns_out_not_to_be_a_stop_goes_out():
    m = StopMatcher(("</answer>",))
    assert m.feed("a </a") == ("a ", False)
    assert m.feed("b>") == ("</ab>", False)  # no stop after all: all of it, in order
    assert m.feed("</") == ("", False)
    assert m.flush() == "</"  # the output ended while it was held: it was text


def test_the_stop_that_starts_first_wins_even_if_another_ends_first():
    # `bc` ends before `abcd` does, but `abcd` starts first: the output ends before it.
    assert StopMatcher(("bc", "abcd")).feed("xabcdy") == ("x", True)
    assert StopMatcher(("abcd", "bc")).feed("xabcy") == ("xa", True)  # `abcd` never came


def test_held_text_is_the_longest_end_that_begins_any_stop():
    m = StopMatcher(("abab", "bx"))
    assert m.feed("zaba") == ("z", False)  # `aba` begins `abab`
    assert m.feed("bx") == ("", True)  # `abab` from the held text on, before `bx`
    m = StopMatcher(("aab",))
    assert m.feed("aaaa") == ("aa", False)
    assert m.feed("b") == ("", True)


def test_stops_of_other_scripts_and_empty_ones():
    assert out(("🚀", ""), ["go ", "\U0001f680", "!"]) == "go "
    assert out(("",), ["all", " of it"]) == "all of it"
    assert out((), ["no", " stops"]) == "no stops"
    assert out(("ünd",), ["Grü", "nd ü", "nd"]) == "Gr"  # across the split of a word


alphabet = st.sampled_from("ab🚀")


@settings(max_examples=400, deadline=None)
@given(
    stops=st.lists(st.text(alphabet, max_size=5), max_size=5).map(tuple),
    pieces=st.lists(st.text(alphabet, max_size=6), max_size=12),
)
def test_same_answers_as_the_plain_matcher(stops, pieces):
    assert run(StopMatcher(stops), pieces) == run(NaiveMatcher(stops), pieces)


def _calls(matcher: Any, pieces: list[str]) -> int:
    """Function calls (Python's and builtins', e.g. str.find) made while the pieces are fed."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(profile)
    try:
        for piece in pieces:
            matcher.feed(piece)
    finally:
        sys.setprofile(None)
    return count


def test_work_per_token_does_not_grow_with_the_stops():
    # 16 stops of 256 characters (the limits' most, --max-stops and --max-stop-chars) that all
    # begin like the output: the plain matcher looked for each, across its whole held text,
    # on every token. The automaton takes a few steps per character, whatever the stops.
    pieces = ["aaaa"] * 200
    many = tuple("a" * 255 + chr(ord("A") + i) for i in range(16))
    one = many[:1]
    per_token_many = _calls(StopMatcher(many), pieces) / len(pieces)
    per_token_one = _calls(StopMatcher(one), pieces) / len(pieces)
    assert per_token_many <= per_token_one * 1.25 + 1, (per_token_one, per_token_many)
    assert per_token_many <= 4 * 4 + 8  # a few calls per character of the token
