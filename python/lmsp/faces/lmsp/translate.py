"""From a validated LMSP request body to the plan the service runs."""

from __future__ import annotations

from typing import Any

from ...engine.sampling import DEFAULT_TEMPERATURE, Sampling
from ...engine.tools import NamedChoice, ToolChoice
from ...service.plan import GenerationPlan, JsonOutput, ToolUse
from ..reasoning import reasoning_of_extensions
from ..sampling import cache_salt_of, narrowing_of, sampling_of

__all__ = ["lmsp_plan"]


def _choice(value: Any) -> ToolChoice:
    return NamedChoice(value["name"]) if isinstance(value, dict) else value


def lmsp_plan(request: dict[str, Any], owner: str) -> GenerationPlan:
    """`request`: what `protocol.requests.validate_response_request` returned."""
    extensions: dict[str, Any] = request.get("extensions", {})
    tools = request.get("tools") or []
    use = None
    if tools or request.get("tool_choice") not in (None, "auto"):
        use = ToolUse(
            tuple(tools),
            _choice(request.get("tool_choice", "auto")),
            # Several calls only when asked for (R6.5-7): one by default.
            parallel=extensions.get("parallel_tool_calls") is True,
        )
    form = request.get("response_format") or {}
    output = None
    if form.get("type") == "json_schema":
        spec = form["json_schema"]
        output = JsonOutput(spec["name"], spec["schema"], narrowing=narrowing_of(extensions))
    sampling = Sampling(temperature=request.get("temperature", DEFAULT_TEMPERATURE))
    return GenerationPlan(
        model=request["model"],
        input=tuple(request["input"]),
        owner=owner,
        sampling=sampling_of(sampling, extensions),
        max_output_tokens=request.get("max_output_tokens"),
        output=output,
        tools=use,
        store=bool(request.get("store")),
        previous_response_id=request.get("previous_response_id"),
        stream=bool(request.get("stream")),
        reasoning=reasoning_of_extensions(extensions),
        cache_salt=cache_salt_of(extensions.get("cache_salt"), "extensions.cache_salt"),
    )
