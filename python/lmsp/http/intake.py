"""Reading the body of `POST /responses` and `POST /tasks`: its media type, size and depth, the
protocol's validation, the service's limits, and the scope a continuation needs."""

from __future__ import annotations

from typing import Any

from ..protocol.requests import parse_json_body, validate_response_request
from ..security.guard import Guard
from ..security.limits import Limits, check_body_depth, check_request
from ..security.scopes import RESPONSES_READ
from .request import Request

__all__ = ["check_plan", "read_json_body", "read_response_request"]


async def read_json_body(req: Request, max_body: int, limits: Limits) -> Any:
    """The body as parsed JSON, within the size and depth limits (any face's request)."""
    body = parse_json_body(await req.body(max_body))
    check_body_depth(body, limits)
    return body


def check_plan(req: Request, request: dict[str, Any], limits: Limits) -> None:
    """A validated request (whichever face it came through) against the service's limits and
    the scope a continuation needs."""
    check_request(request, limits)
    if request.get("previous_response_id"):
        # Continuing reads the stored response back into the model's context.
        Guard.require(req.principal, RESPONSES_READ, param="previous_response_id")


async def read_response_request(req: Request, max_body: int, limits: Limits) -> tuple[Any, dict[str, Any]]:
    """The body as parsed JSON, and as a validated request."""
    body = await read_json_body(req, max_body, limits)
    request = validate_response_request(body)
    check_plan(req, request, limits)
    return body, request
