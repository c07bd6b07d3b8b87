"""How much a thinking model may think, as every face states it, checked once.

`/v1/responses` says `reasoning.effort`, Chat Completions `reasoning_effort` (their schemas
check the values: none, minimal, low, medium, high, xhigh); LMSP carries it in `extensions`
(`reasoning_effort`, and `reasoning_budget`: thinking tokens at most), a free object checked
here, naming `extensions.<name>`. Models that do not think ignore it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..protocol.errors import ProblemError
from ..service.plan import REASONING_EFFORTS, ReasoningControl, ReasoningEffort

__all__ = ["reasoning_of", "reasoning_of_extensions", "reasoning_of_request"]

# OpenAI's efforts past the four a local model maps to.
_NEAREST: dict[str, ReasoningEffort] = {"minimal": "low", "xhigh": "high"}
MAX_BUDGET = 1 << 20


def reasoning_of(effort: str | None, budget: int | None = None) -> ReasoningControl | None:
    """A plan's control from a validated effort (None: the model's default)."""
    if effort is None and budget is None:
        return None
    chosen: ReasoningEffort = "medium"
    if effort is not None:
        for known in REASONING_EFFORTS:
            if known == effort:
                chosen = known
        chosen = _NEAREST.get(effort, chosen)
    return ReasoningControl(chosen, budget)


def reasoning_of_request(effort: str | None, extensions: Mapping[str, Any]) -> ReasoningControl | None:
    """`/v1/responses`: OpenAI's `reasoning.effort`, with LMSP's `extensions` (the budget, and an
    effort where OpenAI's field says none)."""
    own = reasoning_of_extensions(extensions)
    if effort is None:
        return own
    return reasoning_of(effort, own.budget_tokens if own is not None else None)


def reasoning_of_extensions(extensions: Mapping[str, Any]) -> ReasoningControl | None:
    effort = extensions.get("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ProblemError(
            "invalid_request",
            "extensions.reasoning_effort is one of " + ", ".join(REASONING_EFFORTS),
            param="extensions.reasoning_effort",
        )
    budget = extensions.get("reasoning_budget")
    if budget is not None and (
        not isinstance(budget, int) or isinstance(budget, bool) or not 1 <= budget <= MAX_BUDGET
    ):
        raise ProblemError(
            "invalid_request",
            f"extensions.reasoning_budget is an integer from 1 to {MAX_BUDGET}",
            param="extensions.reasoning_budget",
        )
    return reasoning_of(effort, budget)
