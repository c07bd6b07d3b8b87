"""The `Idempotency-Key` header (§9, profile): parsing it, and replaying a recorded result."""

from __future__ import annotations

import re
from typing import Any

from ..protocol.errors import ProblemError
from ..protocol.openapi import IDEMPOTENCY_KEY_PATTERN
from ..store import IdempotencyRecord
from .request import Request

__all__ = ["idempotency_key", "send_replay"]

_KEY = re.compile(IDEMPOTENCY_KEY_PATTERN)
HEADER = "Idempotency-Key"


def idempotency_key(req: Request) -> str | None:
    """The key, unquoted (`"abc"` and `abc` are the same key); None when there is none."""
    values = req.header_values("idempotency-key")
    if not values:
        if "idempotency-key" in req.scope.headers:  # present, but granian could not decode it
            raise ProblemError("invalid_request", "Idempotency-Key must be printable ASCII", param=HEADER)
        return None
    if len(values) > 1:
        raise ProblemError("invalid_request", "send at most one Idempotency-Key header", param=HEADER)
    value = values[0]
    if not _KEY.match(value):
        raise ProblemError(
            "invalid_request",
            "Idempotency-Key must be 1-255 printable ASCII characters, bare or as a quoted string",
            param=HEADER,
        )
    return value[1:-1] if value.startswith('"') else value


def send_replay(proto: Any, record: IdempotencyRecord) -> None:
    assert record.status is not None
    proto.response_bytes(record.status, [*record.headers, ("idempotent-replayed", "true")], record.body)
