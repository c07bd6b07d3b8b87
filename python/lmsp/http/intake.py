"""Reading the body of `POST /responses` and `POST /tasks`: its media type, size and depth, the
protocol's validation, the service's limits, and the scope a continuation needs."""

from __future__ import annotations

from typing import Any

from ..protocol.requests import parse_json_body, validate_response_request
from ..security.guard import Guard
from ..security.limits import Limits, check_body_depth, check_request
from ..security.scopes import RESPONSES_READ
from .request import Request

__all__ = ["read_response_request"]


async def read_response_request(req: Request, max_body: int, limits: Limits) -> tuple[Any, dict[str, Any]]:
    """The body as parsed JSON, and as a validated request."""
    body = parse_json_body(await req.body(max_body))
    check_body_depth(body, limits)
    request = validate_response_request(body)
    check_request(request, limits)
    if request.get("previous_response_id"):
        # Continuing reads the stored response back into the model's context.
        Guard.require(req.principal, RESPONSES_READ, param="previous_response_id")
    return body, request
