"""The client against a hostile or broken service: an event that never ends is cut at a bound,
ids cannot reach another path, and a Retry-After that is not ASCII digits is ignored, not raised."""

from __future__ import annotations

import pytest

from lmsp.client.calls import model_segments, segment
from lmsp.client.retry import retry_after_seconds
from lmsp.client.sse import BoundedParser, EventTooLarge, iter_events


def test_an_event_that_never_ends_is_cut():
    parser = BoundedParser(max_bytes=1000)
    assert parser.feed(b"data: x\n\n")[0].data == "x"
    with pytest.raises(EventTooLarge):
        for _ in range(20):
            parser.feed(b"data: " + b"y" * 100)


def test_events_and_keepalives_reset_the_count():
    parser = BoundedParser(max_bytes=1000)
    for _ in range(100):  # 100 events of 600 bytes, 100 comments: far more than 1000 in all
        assert len(parser.feed(b"data: " + b"z" * 600 + b"\n\n")) == 1
        assert parser.feed(b": keep-alive\n\n") == []
    assert [e.data for e in iter_events([b"data: a\n", b"\n"], max_bytes=10)] == ["a"]


def test_ids_are_one_path_segment():
    assert segment("../models") == "..%2Fmodels"
    assert segment("..") == "%2E%2E"
    assert segment("a?b#c%d") == "a%3Fb%23c%25d"
    assert model_segments("hf.co/org/repo:Q4 x") == "hf.co/org/repo%3AQ4%20x"


@pytest.mark.parametrize("value", ["²", "٣", "1²", "-1", "", "soon"])
def test_retry_after_that_is_not_a_number_is_ignored(value):
    assert retry_after_seconds(value) is None


def test_retry_after_seconds_and_dates():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("Thu, 01 Jan 1970 00:00:00 GMT") == 0.0
