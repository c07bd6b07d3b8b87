"""Reading a creating request's body (its media type, size and depth) and holding any face's
plan to the service's limits and to the scope a continuation needs."""

from __future__ import annotations

from typing import Any

from ..protocol.requests import parse_json_body
from ..security.guard import Guard
from ..security.limits import Limits, check_body_depth, check_request
from ..security.scopes import RESPONSES_READ
from ..service.plan import GenerationPlan
from .request import Request

__all__ = ["check_plan", "read_json_body"]


async def read_json_body(req: Request, max_body: int, limits: Limits, *, any_type: bool = False) -> Any:
    """The body as parsed JSON, within the size and depth limits (any face's request).
    `any_type`: whatever its declared type, from a request with no Origin or an allowed one
    (`Request.body`)."""
    body = parse_json_body(await req.body(max_body, any_type=any_type))
    check_body_depth(body, limits)
    return body


def check_plan(req: Request, plan: GenerationPlan, limits: Limits, stop_param: str = "stop") -> None:
    """A plan (whichever face made it) against the service's limits and the scope a
    continuation needs; `stop_param`: the face's name for its stop sequences."""
    check_request(
        limits,
        plan.input,
        plan.instructions,
        plan.max_output_tokens,
        plan.tools.tools if plan.tools is not None else (),
        plan.output.schema if plan.output is not None else None,
        plan.stop,
        stop_param,
    )
    if plan.previous_response_id:
        # Continuing reads the stored response back into the model's context.
        Guard.require(req.principal, RESPONSES_READ, param="previous_response_id")
