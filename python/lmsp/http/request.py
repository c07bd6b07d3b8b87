"""An incoming request: what a route needs from granian's scope and protocol."""

from __future__ import annotations

import asyncio
import re
from typing import Any
from urllib.parse import parse_qs

from ..protocol.errors import ProblemError
from ..security.guard import LOCAL, Principal

__all__ = ["Request", "parse_count"]

# `application/json`, with at most a UTF-8 charset: the only bodies this service reads. A page
# in a browser can POST text/plain or a form anywhere without asking first; JSON it cannot.
_JSON = re.compile(r"application/json\s*(;\s*charset\s*=\s*\"?utf-8\"?\s*)?", re.IGNORECASE)
# A count or an id: ASCII digits only. str.isdigit() also takes `²` or `٣`, which int() then
# refuses (a 500), or reads as a number no client meant.
_COUNT = re.compile(r"[0-9]{1,18}")
# A body up to this much past its limit is read to its end and dropped before the 413 goes
# out. Answering while the client still sends, then closing, makes the kernel reset the
# connection with unread bytes in it, and the reset can destroy the answer before the client
# reads it ("server disconnected"). Beyond this the 413 goes out at once, with the connection
# closed: such a client may miss it, but it costs the service nothing more.
_DRAIN = 16 * 1024 * 1024


def parse_count(value: str, param: str, low: int = 0, high: int | None = None) -> int:
    """`value` as a non-negative integer from `low` to `high`, else a 400 naming `param`."""
    number = int(value) if _COUNT.fullmatch(value) else None
    if number is None or number < low or (high is not None and number > high):
        span = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise ProblemError("invalid_request", f"`{param}` is an integer {span}, not {value!r}", param=param)
    return number


class Request:
    __slots__ = (
        "body_deadline",
        "body_timeout",
        "origin_vetted",
        "params",
        "prefetched",
        "principal",
        "proto",
        "scope",
    )

    def __init__(
        self,
        scope: Any,
        proto: Any,
        params: dict[str, str],
        principal: Principal = LOCAL,
        body_timeout: float = 30.0,
        body_deadline: float = 120.0,
        origin_vetted: bool = False,
    ) -> None:
        # Whether the app checked this request's `Origin` against the allowed ones (or it has
        # none): what `body(any_type=True)` needs before it reads a body that is not JSON.
        self.origin_vetted = origin_vetted
        self.scope = scope
        self.proto = proto
        self.params = params
        self.principal = principal
        self.body_timeout = body_timeout
        self.body_deadline = body_deadline
        # The body, when the app read it before the route (to see its model, http/forward.py):
        # `body` hands it out after the same media type check.
        self.prefetched: bytes | None = None

    @property
    def owner(self) -> str:
        return self.principal.owner

    def header(self, name: str) -> str | None:
        value: str | None = self.scope.headers.get(name)
        return value

    def header_values(self, name: str) -> list[str]:
        """Every value of a header that may come more than once (`name` in lower case)."""
        return [v for k, v in self.scope.headers.items() if k == name]

    def query_value(self, name: str) -> str | None:
        """A query parameter that may be given at most once; None when absent. Blank values
        are kept: `?after=` is a mistake to report, not a missing parameter."""
        values = parse_qs(self.scope.query_string, keep_blank_values=True).get(name)
        if values is None:
            return None
        if len(values) != 1:
            raise ProblemError("invalid_request", f"give `{name}` once", param=name)
        value: str = values[0]
        return value

    def query_count(self, name: str, default: int, low: int = 0, high: int | None = None) -> int:
        """A numeric query parameter, strictly ASCII digits within its range; `default` when absent."""
        value = self.query_value(name)
        return default if value is None else parse_count(value, name, low, high)

    async def body(self, limit: int, *, any_type: bool = False) -> bytes:
        """The whole JSON body (415 for any other type), refusing (413) one that grows past
        `limit` bytes (kept no further; read on and dropped up to _DRAIN more) and (408) when
        the client pauses longer than `body_timeout` between chunks or has not sent it all
        within `body_deadline`.

        `any_type`: a body of any declared type (or none) is read as JSON too, when the
        request carries no `Origin` or its `Origin` is one the service allows (its own, or
        `--cors-origin`'s: the app refused any other before a route ran). A web page cannot
        post to the service unseen this way: a browser sends `Origin` with every POST,
        cross-site form posts included (Fetch, "append a request Origin header")."""
        kind = self.header("content-type")
        if kind is None or not _JSON.fullmatch(kind.strip()):
            if not (any_type and self.origin_vetted):
                raise ProblemError(
                    "unsupported_media_type",
                    f"the body must be application/json, not {kind!r}",
                    param="Content-Type",
                )
        if self.prefetched is not None:
            return self.prefetched  # read within the same limit (App: the service's max_body)
        declared = self.header("content-length")
        if declared is not None and _COUNT.fullmatch(declared) and int(declared) > limit + _DRAIN:
            raise _too_large(limit, close=True)
        chunks: list[bytes] = []
        size = 0
        ended = False
        reader = aiter(self.proto)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.body_deadline
        while True:
            left = deadline - loop.time()
            try:
                chunk = await asyncio.wait_for(anext(reader), min(self.body_timeout, max(left, 0.0)))
            except StopAsyncIteration:
                break
            except asyncio.TimeoutError:
                why = (
                    f"the body was not whole within {self.body_deadline:g} s"
                    if left <= self.body_timeout
                    else f"the body stalled for more than {self.body_timeout:g} s"
                )
                raise ProblemError("request_timeout", why, headers=[("connection", "close")]) from None
            if ended:
                raise _bad_framing()
            # granian ends a body with one empty chunk, and hands over a framing error (or a
            # trailer section) as an empty chunk too, before that one.
            ended = not chunk
            size += len(chunk)
            if size > limit + _DRAIN:
                raise _too_large(limit, close=True)
            if size > limit:
                chunks.clear()  # read on to the end, keeping nothing: see _DRAIN
            else:
                chunks.append(chunk)
        if size > limit:
            raise _too_large(limit)
        return b"".join(chunks)


def _bad_framing() -> ProblemError:
    # The connection's framing is lost past this point: nothing more can be read from it.
    return ProblemError(
        "invalid_request",
        "the chunked body is malformed (a chunk not ended by CRLF, or a trailer section, "
        "which this service does not take)",
        param="Transfer-Encoding",
        headers=[("connection", "close")],
    )


def _too_large(limit: int, *, close: bool = False) -> ProblemError:
    headers = [("connection", "close")] if close else []
    return ProblemError("request_too_large", f"the body is larger than {limit} bytes", headers=headers)
