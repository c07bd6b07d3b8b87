"""What the service runs: one generation, as a face understood its request.

Every face (LMSP, OpenAI, …) validates its own request and translates it into one
`GenerationPlan`, once; nothing below the face sees a request body. The items and tools inside
are LMSP's own JSON values (`protocol/items.py`, `protocol/requests.py`), already validated,
which is also how the store keeps them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..engine.sampling import Sampling
from ..engine.tools import NamedChoice, ToolChoice
from ..protocol.owners import LOCAL_OWNER

__all__ = [
    "GenerationPlan",
    "Item",
    "JsonOutput",
    "NamedChoice",
    "ReasoningControl",
    "ReasoningEffort",
    "Tool",
    "ToolChoice",
    "ToolUse",
]

Item = Mapping[str, Any]  # an LMSP input item (message, function_call, …), validated
Tool = Mapping[str, Any]  # an LMSP tool (function, or custom), validated


@dataclass(frozen=True)
class ToolUse:
    tools: tuple[Tool, ...]
    choice: ToolChoice = "auto"
    # Several calls in one response (up to the service's cap), else at most one (R6.5-7).
    parallel: bool = False

    @property
    def may_call(self) -> bool:
        return self.choice != "none"


@dataclass(frozen=True)
class JsonOutput:
    """The output is one JSON value valid under `schema` (R6.5-5). `narrowing`: False when the
    request turned the service's schema narrowing off (engine/schema_check.py, `relax`)."""

    name: str
    schema: Mapping[str, Any]
    narrowing: bool = True


ReasoningEffort = Literal["none", "low", "medium", "high"]
REASONING_EFFORTS: tuple[ReasoningEffort, ...] = ("none", "low", "medium", "high")


@dataclass(frozen=True)
class ReasoningControl:
    """How much a thinking model may think before it answers (OpenAI's `reasoning.effort`,
    Chat's `reasoning_effort`, Ollama's `think`, Anthropic's `thinking`). `none` turns thinking
    off where the template can; the others map to the template's own switch (harmony's
    effort) and to a budget of thinking tokens. Models that do not think ignore it."""

    effort: ReasoningEffort = "medium"
    # Thinking tokens at most (None: the effort's default budget); counts toward max_output_tokens.
    budget_tokens: int | None = None


@dataclass(frozen=True)
class GenerationPlan:
    model: str
    # New input items, oldest first; a continuation's history comes before them.
    input: tuple[Item, ...]
    owner: str = LOCAL_OWNER
    # A system message before everything, history included, and never stored with the input.
    instructions: str | None = None
    sampling: Sampling = field(default_factory=Sampling)
    max_output_tokens: int | None = None
    # The output ends before the first of these (free text only), which is never sent.
    stop: tuple[str, ...] = ()
    output: JsonOutput | None = None
    tools: ToolUse | None = None
    store: bool = False
    previous_response_id: str | None = None
    stream: bool = False
    # None: the model's default (a thinking model thinks, at its default budget).
    reasoning: ReasoningControl | None = None
    # A further part of the prompt cache's scope (OpenAI's and vLLM's `cache_salt`): cached
    # prompt cells are reused only by requests of the same owner and the same salt.
    cache_salt: str | None = None

    @property
    def calls_possible(self) -> bool:
        """Whether the output may hold tool calls (`none` makes it all text)."""
        return self.tools is not None and bool(self.tools.tools) and self.tools.may_call
