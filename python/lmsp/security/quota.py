"""Per-token quotas and usage: requests a minute, tokens a minute, requests at once
(`lmsp token create --rpm/--tpm/--streams`), and what each token has used.

Only requests that ask for model work are metered (each face marks those routes: generating,
counting a prompt's tokens, embeddings); reading stored responses, tasks and models is not.

Each rate is a bucket that holds a minute's worth and refills continuously (rpm/60 requests a
second), so a client never waits for a window to turn over, and `x-ratelimit-reset-*` says, as
OpenAI's do, how long until the bucket is full again. Admission takes one request from its
bucket and needs at least one token left in the token bucket. A generation is charged before it
starts, once its prompt is rendered: its input and the most it may write (`max_output_tokens`,
else what the context leaves), as OpenAI counts `max_tokens` toward its token limits, so that
requests running at once cannot together overrun the bucket (60 concurrent 4,096-token
requests on 1,000 a minute all passed when output was charged at the end). The bucket must hold
that much, or the whole bucket for a generation larger than it, else 429; when it ends, what it
did not write is given back. So the bucket goes below zero only by a generation larger than the
whole bucket, and the token's next request is refused until it has refilled past zero. A
request counts toward `streams` from its admission until it and every generation it started
have ended, so a background task holds one until it ends, not just while it is created.

The buckets are this process's: with several replicas each enforces the quota on its own
(a token spread over N replicas gets up to N times it). What each token used is added up
across replicas in the token store (`Tokens.add_usage`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from ..observability.metrics import TokenCounts
from ..protocol.errors import ProblemError
from ..tokens import Quota, TokenUsage
from .guard import Principal

__all__ = ["LIMITS", "Limiter", "Meter", "current", "metering", "reset_text"]

# What a refusal was for, as the metrics label it.
LIMITS = ("requests", "tokens", "streams")


class _Bucket:
    """Holds up to `size`, refilled at size/60 a second; may go below zero (charged after use)."""

    __slots__ = ("at", "level", "size")

    def __init__(self, size: int, now: float) -> None:
        self.size = size
        self.level = float(size)
        self.at = now

    def refill(self, size: int, now: float) -> None:
        if size != self.size:  # the quota changed (`lmsp token set`): the new size, no more than full
            self.level = min(self.level, float(size))
            self.size = size
        self.level = min(float(size), self.level + (now - self.at) * size / 60.0)
        self.at = now

    def wait_for(self, level: float) -> float:
        """Seconds until it holds `level` again."""
        return max(0.0, (level - self.level) * 60.0 / self.size)

    def headers(self, kind: str) -> list[tuple[str, str]]:
        return [
            (f"x-ratelimit-limit-{kind}", str(self.size)),
            (f"x-ratelimit-remaining-{kind}", str(max(0, math.floor(self.level)))),
            (f"x-ratelimit-reset-{kind}", reset_text(self.wait_for(self.size))),
        ]


@dataclass
class _TokenState:
    requests: _Bucket | None = None
    tokens: _Bucket | None = None
    in_flight: int = 0
    used: TokenUsage = field(default_factory=TokenUsage)  # since this process started
    unreported: TokenUsage = field(default_factory=TokenUsage)  # since the last `take_unreported`
    limited: dict[str, int] = field(default_factory=dict)  # refusals by LIMITS


def reset_text(seconds: float) -> str:
    """A duration as OpenAI's `x-ratelimit-reset-*` writes it: `20ms`, `1s`, `6m0s`, `1m30.5s`."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60.0)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


class Meter:
    """One admitted request of a token: it holds one of the token's `streams` until the request
    and every generation it started have ended, and charges what they used."""

    __slots__ = ("_clock", "_holds", "_state")

    def __init__(self, state: _TokenState, clock: Callable[[], float] = time.monotonic) -> None:
        self._state = state
        self._clock = clock
        self._holds = 1  # the request itself, released by the app when it has answered

    def hold(self) -> None:
        """A generation this request started: it keeps the request's place until `release`."""
        if self._holds == 0:  # started after its request answered (a task whose model loaded late)
            self._state.in_flight += 1
        self._holds += 1

    def release(self) -> None:
        self._holds -= 1
        if self._holds == 0:
            self._state.in_flight -= 1

    def charge(self, input_tokens: int = 0, output_tokens: int = 0) -> None:
        state = self._state
        if state.tokens is not None:
            state.tokens.level -= input_tokens + output_tokens
        for usage in (state.used, state.unreported):
            usage.input_tokens += input_tokens
            usage.output_tokens += output_tokens

    def reserve(self, input_tokens: int, most_output: int) -> None:
        """Before a generation starts: charges its input and sets aside the most it may write;
        `settle` with what it wrote gives back the rest. Raises 429 `rate_limit_exceeded` when
        the token bucket holds less than both (or than the whole bucket, for more than that)."""
        state, bucket = self._state, self._state.tokens
        if bucket is not None:
            bucket.refill(bucket.size, self._clock())
            need = input_tokens + most_output
            if bucket.level < min(need, bucket.size):
                _refuse(
                    state,
                    "tokens",
                    f"this request may use {need} tokens ({input_tokens} of input, at most {most_output} of "
                    f"output: its max_output_tokens) and this token has {max(0, math.floor(bucket.level))} left "
                    f"of {bucket.size} a minute (`--tpm`)",
                    bucket.wait_for(min(need, bucket.size)),
                    rates=False,  # the answer has its admission's `x-ratelimit-*` already
                )
            bucket.level -= need
        for usage in (state.used, state.unreported):
            usage.input_tokens += input_tokens

    def give_back(self, input_tokens: int, reserved: int) -> None:
        """Undoes a `reserve` whose generation never started."""
        state = self._state
        if state.tokens is not None:
            state.tokens.level = min(float(state.tokens.size), state.tokens.level + input_tokens + reserved)
        for usage in (state.used, state.unreported):
            usage.input_tokens -= input_tokens

    def settle(self, reserved: int, output_tokens: int) -> None:
        """A generation that set aside `reserved` output tokens ended having written
        `output_tokens`: the rest goes back to the bucket."""
        state = self._state
        if state.tokens is not None:
            state.tokens.level = min(float(state.tokens.size), state.tokens.level + reserved - output_tokens)
        for usage in (state.used, state.unreported):
            usage.output_tokens += output_tokens


class Limiter:
    """Every token's buckets and counts, in this process; on the event loop only."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tokens: dict[str, _TokenState] = {}

    def admit(self, principal: Principal) -> tuple[Meter, list[tuple[str, str]]] | None:
        """A metered request of `principal`: its meter and the `x-ratelimit-*` headers for its
        answer, or None (the tokenless local client: nothing to meter). Raises 429
        `rate_limit_exceeded` with `Retry-After` when the token's quota has no room."""
        ident = principal.token_id
        if ident is None:
            return None
        quota = principal.quota
        state = self._tokens.get(ident)
        if state is None:
            state = self._tokens[ident] = _TokenState()
        now = self._clock()
        state.requests = _refilled(state.requests, quota.rpm, now)
        state.tokens = _refilled(state.tokens, quota.tpm, now)
        self._check(state, quota)
        if state.requests is not None:
            state.requests.level -= 1
        state.in_flight += 1
        state.used.requests += 1
        state.unreported.requests += 1
        return Meter(state, self._clock), _headers(state)

    def _check(self, state: _TokenState, quota: Quota) -> None:
        if quota.streams is not None and state.in_flight >= quota.streams:
            _refuse(
                state,
                "streams",
                f"this token has {state.in_flight} requests running, its limit (`--streams {quota.streams}`)",
                1.0,
            )
        if state.requests is not None and state.requests.level < 1:
            _refuse(
                state,
                "requests",
                f"this token may make {quota.rpm} requests a minute (`--rpm`)",
                state.requests.wait_for(1),
            )
        if state.tokens is not None and state.tokens.level < 1:
            _refuse(
                state,
                "tokens",
                f"this token may use {quota.tpm} tokens a minute (`--tpm`), input and output together",
                state.tokens.wait_for(1),
            )

    def counts(self) -> list[TokenCounts]:
        """Every token's counts since this process started, for the metrics."""
        return [
            TokenCounts(ident, s.used.requests, s.used.input_tokens, s.used.output_tokens, s.in_flight, dict(s.limited))
            for ident, s in self._tokens.items()
        ]

    def take_unreported(self) -> dict[str, TokenUsage]:
        """What each token used since the last call, for the token store; starts anew."""
        taken: dict[str, TokenUsage] = {}
        for ident, state in self._tokens.items():
            if state.unreported:
                taken[ident], state.unreported = state.unreported, TokenUsage()
        return taken

    def give_back(self, unreported: dict[str, TokenUsage]) -> None:
        """Counts a report could not write: added to the next one."""
        for ident, usage in unreported.items():
            state = self._tokens.get(ident)
            if state is not None:
                state.unreported.add(usage)


def _refuse(state: _TokenState, limit: str, detail: str, wait: float, rates: bool = True) -> None:
    state.limited[limit] = state.limited.get(limit, 0) + 1
    state.used.limited += 1
    state.unreported.limited += 1
    retry = max(1, math.ceil(wait))
    raise ProblemError(
        "rate_limit_exceeded",
        f"{detail}; retry in {retry} s",
        headers=[("retry-after", str(retry)), *(_headers(state) if rates else [])],
    )


def _refilled(bucket: _Bucket | None, size: int | None, now: float) -> _Bucket | None:
    if size is None:
        return None
    if bucket is None:
        return _Bucket(size, now)
    bucket.refill(size, now)
    return bucket


def _headers(state: _TokenState) -> list[tuple[str, str]]:
    headers: list[tuple[str, str]] = []
    if state.requests is not None:
        headers += state.requests.headers("requests")
    if state.tokens is not None:
        headers += state.tokens.headers("tokens")
    return headers


_CURRENT: ContextVar[Meter | None] = ContextVar("lmsp_meter", default=None)


def current() -> Meter | None:
    """The meter of the request being answered (the service charges generations to it)."""
    return _CURRENT.get()


@contextmanager
def metering(meter: Meter | None) -> Iterator[None]:
    """Answers a request under `meter`, and releases the request's own hold at the end."""
    if meter is None:
        yield
        return
    reset = _CURRENT.set(meter)
    try:
        yield
    finally:
        _CURRENT.reset(reset)
        meter.release()
