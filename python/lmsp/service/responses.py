"""Creating responses: from a validated request to a generation whose events fill an EventLog.

Knows nothing of HTTP. Every view of a response (stream, sync, later tasks) reads the run's
log; `final_response` is the sync view.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from lmsp._core import EventLog

from ..engine.backends import ContextLengthExceeded
from ..engine.chat_template import TemplateRenderError
from ..engine.sequence import GenerationRequest, Overloaded, Sequence
from ..protocol import events as ev
from ..protocol.errors import ProblemError
from ..protocol.ids import new_id
from .builder import EventBuilder
from .logwait import wait_for_events
from .models import ModelManager

__all__ = ["DEFAULT_TEMPERATURE", "ResponseRun", "ResponsesService"]

# The draft leaves the default open; 1.0 samples the model as trained (as the Responses API does).
DEFAULT_TEMPERATURE = 1.0


@dataclass
class ResponseRun:
    """One response being generated: its identity, its events, and how to stop it."""

    id: str
    model: str
    created_at: int
    log: EventLog
    sequence: Sequence

    def snapshot(self) -> dict[str, Any]:
        return ev.fold(self.log.entries_after(0), response_id=self.id, created_at=self.created_at, model=self.model)

    def cancel(self) -> None:
        self.sequence.cancel()


def _chat_messages(items: list[dict[str, Any]]) -> list[dict[str, str]]:
    messages = []
    for i, item in enumerate(items):
        if item["type"] != "message":
            raise ProblemError(
                "unsupported_capability",
                f"input item of type {item['type']!r} needs the 'tools' capability, which this model lacks",
                param=f"input[{i}].type",
            )
        text = "".join(part["text"] for part in item["content"])
        messages.append({"role": item["role"], "content": text})
    return messages


def _check_capabilities(request: dict[str, Any], capabilities: tuple[str, ...]) -> None:
    needs = []
    if request.get("tools") or request.get("tool_choice") not in (None, "auto", "none"):
        needs.append(("tools", "tools"))
    if request.get("response_format", {}).get("type") == "json_schema":
        needs.append(("structured_output", "response_format"))
    if request.get("previous_response_id"):
        needs.append(("conversations", "previous_response_id"))
    for capability, param in needs:
        if capability not in capabilities:
            raise ProblemError(
                "unsupported_capability",
                f"this request needs the {capability!r} capability, which the model lacks",
                param=param,
            )


class ResponsesService:
    def __init__(self, models: ModelManager) -> None:
        self.models = models

    async def create(self, request: dict[str, Any]) -> ResponseRun:
        backend = await self.models.get(request["model"])
        _check_capabilities(request, backend.capabilities)
        messages = _chat_messages(request["input"])
        try:
            prompt, prompt_text = backend.prepare(messages)
        except ContextLengthExceeded as exc:
            raise ProblemError("context_length_exceeded", str(exc), param="input") from None
        except TemplateRenderError as exc:
            raise ProblemError("invalid_request", f"the model's chat template rejected the input: {exc}", param="input") from None

        response_id = new_id("resp")
        log = EventLog()
        builder = EventBuilder(log, response_id)
        builder.created()
        generation = GenerationRequest(
            prompt=prompt,
            max_tokens=request.get("max_output_tokens"),
            temperature=request.get("temperature", DEFAULT_TEMPERATURE),
            seed=_seed(request),
            sink=builder,
            prompt_text=prompt_text,
        )
        try:
            sequence = backend.submit(generation)
        except Overloaded as exc:
            raise ProblemError(
                "overloaded", "the model's queue is full; retry later", headers=[("retry-after", str(exc.retry_after))]
            ) from None
        return ResponseRun(response_id, request["model"], int(time.time()), log, sequence)

    async def final_response(self, run: ResponseRun) -> dict[str, Any]:
        """The sync view: waits for the run's final event, then folds the log."""
        while not run.log.closed:
            await wait_for_events(run.log, run.log.last_id)
        return run.snapshot()


def _seed(request: dict[str, Any]) -> int:
    """`extensions.seed` makes sampling repeatable; anything else there is ignored (R6.1-8)."""
    seed = request.get("extensions", {}).get("seed")
    valid = isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 2**32
    return seed if valid else -1
