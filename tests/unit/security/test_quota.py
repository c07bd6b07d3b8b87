"""security/quota.py: a token's buckets and running requests, on a clock the test turns."""

from __future__ import annotations

import pytest

from lmsp.protocol.errors import ProblemError
from lmsp.security.guard import LOCAL, Principal
from lmsp.security.quota import Limiter, reset_text
from lmsp.tokens import Quota, TokenUsage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def principal(ident: str, quota: Quota) -> Principal:
    return Principal(f"token:{ident}", frozenset(), ident, quota)


def refused(limiter: Limiter, who: Principal) -> ProblemError:
    with pytest.raises(ProblemError) as caught:
        limiter.admit(who)
    assert caught.value.code == "rate_limit_exceeded" and caught.value.status == 429
    return caught.value


def test_rpm_refuses_past_the_bucket_and_refills_continuously() -> None:
    clock = Clock()
    limiter = Limiter(clock)
    who = principal("a", Quota(rpm=2))
    remaining = []
    for _ in range(2):
        admitted = limiter.admit(who)
        assert admitted is not None
        meter, headers = admitted
        meter.release()
        remaining.append(dict(headers)["x-ratelimit-remaining-requests"])
        assert dict(headers)["x-ratelimit-limit-requests"] == "2"
    assert remaining == ["1", "0"]
    error = refused(limiter, who)
    headers = dict(error.headers)
    assert headers["retry-after"] == "30"  # one request back at 2 a minute
    assert headers["x-ratelimit-remaining-requests"] == "0" and headers["x-ratelimit-reset-requests"] == "1m0s"
    clock.now += 29.0
    refused(limiter, who)
    clock.now += 1.0
    assert limiter.admit(who) is not None


def test_tpm_charges_after_use_and_refuses_while_the_bucket_is_empty() -> None:
    clock = Clock()
    limiter = Limiter(clock)
    who = principal("a", Quota(tpm=600))  # 10 tokens a second back
    admitted = limiter.admit(who)
    assert admitted is not None
    meter, headers = admitted
    assert dict(headers)["x-ratelimit-remaining-tokens"] == "600"
    meter.charge(input_tokens=500)
    meter.charge(output_tokens=400)  # more than was left: the bucket owes 300
    meter.release()
    error = refused(limiter, who)
    assert dict(error.headers)["retry-after"] == "31"  # back past one token: 301 / 10 a second
    assert dict(error.headers)["x-ratelimit-remaining-tokens"] == "0"
    clock.now += 31.0
    assert limiter.admit(who) is not None


def test_tpm_sets_aside_the_most_a_generation_may_write_and_gives_back_the_rest() -> None:
    # Output charged at the end let 60 concurrent 4,096-token requests through a 1,000-token
    # bucket (issue 50): each now sets aside its max_output_tokens before it starts.
    clock = Clock()
    limiter = Limiter(clock)
    who = principal("a", Quota(tpm=1000))
    meters = []
    for _ in range(4):
        admitted = limiter.admit(who)
        assert admitted is not None
        meters.append(admitted[0])
    for meter in meters[:3]:
        meter.reserve(10, 300)  # 310 each: three fit in 1,000
    with pytest.raises(ProblemError) as caught:
        meters[3].reserve(10, 300)
    error = caught.value
    assert error.status == 429 and "at most 300 of output" in error.detail and "`--tpm`" in error.detail
    assert dict(error.headers)["retry-after"] == "15"  # 70 left, 310 needed: 240 at 1,000 a minute
    meters[0].settle(300, 20)  # wrote 20 of 300: 280 back
    meters[3].reserve(10, 300)
    (counts,) = limiter.counts()
    assert (counts.input_tokens, counts.output_tokens) == (40, 20)  # set aside is not used


def test_a_generation_larger_than_the_bucket_needs_it_full() -> None:
    clock = Clock()
    limiter = Limiter(clock)
    who = principal("a", Quota(tpm=1000))
    admitted = [limiter.admit(who) for _ in range(3)]
    first, second, third = (a[0] for a in admitted if a is not None)
    first.reserve(5, 4096)  # the whole bucket and more: it may go below zero
    with pytest.raises(ProblemError):
        second.reserve(5, 4096)
    first.settle(4096, 4096)
    clock.now += 60.0  # 1,000 back, but the bucket owed 4,101: still short of full
    with pytest.raises(ProblemError):
        third.reserve(5, 4096)
    clock.now += 247.0  # full again
    third.reserve(5, 4096)


def test_a_generation_that_never_started_gives_its_reservation_back() -> None:
    limiter = Limiter(Clock())
    who = principal("a", Quota(tpm=100))
    admitted = limiter.admit(who)
    assert admitted is not None
    meter = admitted[0]
    meter.reserve(30, 60)
    meter.give_back(30, 60)
    meter.reserve(30, 70)  # the whole bucket again
    (counts,) = limiter.counts()
    assert counts.input_tokens == 30


def test_streams_count_a_request_until_it_and_its_generations_end() -> None:
    limiter = Limiter(Clock())
    who = principal("a", Quota(streams=1))
    admitted = limiter.admit(who)
    assert admitted is not None
    meter, headers = admitted
    assert headers == []  # no rate to tell of
    meter.hold()  # a background generation it started
    meter.release()  # the request has answered
    error = refused(limiter, who)
    assert dict(error.headers)["retry-after"] == "1" and "--streams 1" in error.detail
    meter.release()  # the generation ended
    assert limiter.admit(who) is not None


def test_tokens_do_not_share_buckets_and_the_local_client_is_not_metered() -> None:
    limiter = Limiter(Clock())
    a, b = principal("a", Quota(rpm=1)), principal("b", Quota(rpm=1))
    assert limiter.admit(a) is not None
    refused(limiter, a)
    assert limiter.admit(b) is not None
    assert limiter.admit(LOCAL) is None


def test_counts_and_unreported_usage() -> None:
    limiter = Limiter(Clock())
    who = principal("a", Quota(rpm=1))
    admitted = limiter.admit(who)
    assert admitted is not None
    admitted[0].charge(input_tokens=7, output_tokens=3)
    refused(limiter, who)
    (counts,) = limiter.counts()
    assert (counts.token, counts.requests, counts.input_tokens, counts.output_tokens, counts.in_flight) == (
        "a",
        1,
        7,
        3,
        1,
    )
    assert counts.limited == {"requests": 1}
    taken = limiter.take_unreported()
    assert taken == {"a": TokenUsage(requests=1, input_tokens=7, output_tokens=3, limited=1)}
    assert limiter.take_unreported() == {}
    limiter.give_back(taken)  # a report that failed is sent with the next
    assert limiter.take_unreported() == taken


def test_a_changed_quota_takes_effect_at_the_next_request() -> None:
    limiter = Limiter(Clock())
    assert limiter.admit(principal("a", Quota(rpm=1))) is not None
    refused(limiter, principal("a", Quota(rpm=1)))
    admitted = limiter.admit(principal("a", Quota(rpm=None)))  # `lmsp token set a --rpm 0`
    assert admitted is not None and admitted[1] == []


RESETS = [(0.02, "20ms"), (0.0001, "1ms"), (1.0, "1s"), (17.5, "17.5s"), (60.0, "1m0s"), (90.25, "1m30.25s")]


@pytest.mark.parametrize(("seconds", "text"), RESETS)
def test_reset_is_written_as_openai_writes_it(seconds: float, text: str) -> None:
    assert reset_text(seconds) == text
