"""Writing HTTP responses on granian's RSGI protocol: JSON, problem documents, headers."""

from __future__ import annotations

from typing import Any

import orjson

from ..protocol.errors import ProblemError

__all__ = ["LMSP_VERSION", "Sent", "json_headers", "problem_headers", "send_json", "send_problem", "sse_headers"]

# What a response carried: status, headers, body (kept for idempotent replays).
Sent = tuple[int, list[tuple[str, str]], bytes]

LMSP_VERSION = "1.0"


def json_headers(extra: list[tuple[str, str]] | None = None) -> list[tuple[str, str]]:
    return [("content-type", "application/json"), ("lmsp-version", LMSP_VERSION), *(extra or [])]


def sse_headers() -> list[tuple[str, str]]:
    return [
        ("content-type", "text/event-stream"),
        ("cache-control", "no-cache"),
        # Reverse proxies (nginx) would otherwise buffer the stream.
        ("x-accel-buffering", "no"),
        ("lmsp-version", LMSP_VERSION),
    ]


def problem_headers(error: ProblemError) -> list[tuple[str, str]]:
    return [("content-type", "application/problem+json"), ("lmsp-version", LMSP_VERSION), *error.headers]


def send_json(proto: Any, status: int, body: Any, extra: list[tuple[str, str]] | None = None) -> Sent:
    sent = (status, json_headers(extra), orjson.dumps(body))
    proto.response_bytes(*sent)
    return sent


def send_problem(proto: Any, error: ProblemError) -> Sent:
    sent = (error.status, problem_headers(error), error.body())
    proto.response_bytes(*sent)
    return sent
