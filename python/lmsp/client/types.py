"""What the client returns: plain frozen dataclasses over the service's JSON, with the
service's own field names. Items and usage stay dicts (typed as TypedDicts): they are the
wire objects, and a field the service adds reaches the caller without a client release."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import orjson

from lmsp.protocol.events import FINAL_EVENTS, TEXT_DELTA

__all__ = ["Event", "Model", "OutputItem", "Response", "Status", "Task", "Usage"]

Status = Literal["in_progress", "completed", "incomplete", "failed", "cancelled"]


class Usage(TypedDict, total=False):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens_details: dict[str, int]  # reasoning_tokens: a thinking model's thinking


class OutputItem(TypedDict, total=False):
    id: str
    type: str  # message | function_call | reasoning
    status: str
    role: str
    content: list[dict[str, Any]]
    call_id: str
    name: str
    arguments: str
    summary: list[dict[str, Any]]


@dataclass(frozen=True)
class Response:
    id: str
    status: Status
    model: str
    output: list[OutputItem]
    usage: Usage | None
    error: dict[str, Any] | None
    incomplete_details: dict[str, Any] | None
    # None for a response folded from a stream: events carry no timestamp.
    created_at: int | None
    object: str = "response"

    @property
    def text(self) -> str:
        """The text of its messages' output_text parts, joined."""
        return "".join(
            part["text"]
            for item in self.output
            if item.get("type") == "message"
            for part in item.get("content", [])
            if part.get("type") == "output_text"
        )

    @property
    def reasoning(self) -> str:
        """A thinking model's thinking: the summary_text of its reasoning items, joined."""
        return "".join(
            part["text"]
            for item in self.output
            if item.get("type") == "reasoning"
            for part in item.get("summary", [])
            if part.get("type") == "summary_text"
        )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Response:
        return cls(
            id=data["id"],
            status=data["status"],
            model=data["model"],
            output=data["output"],
            usage=data.get("usage"),
            error=data.get("error"),
            incomplete_details=data.get("incomplete_details"),
            created_at=data.get("created_at"),
            object=data.get("object", "response"),
        )


@dataclass(frozen=True)
class Event:
    """One §6.3 event: its id (1, 2, 3, … within its response), its name and its data."""

    id: int
    type: str
    data: dict[str, Any] = field(repr=False)

    @property
    def delta(self) -> str:
        """The text an output_text delta adds; "" for every other event."""
        return str(self.data["delta"]) if self.type == TEXT_DELTA else ""

    @property
    def final(self) -> bool:
        return self.type in FINAL_EVENTS

    @classmethod
    def from_sse(cls, event_id: str | None, name: str, data: str) -> Event:
        return cls(int(event_id or 0), name, orjson.loads(data))


@dataclass(frozen=True)
class Task:
    id: str
    status: Status
    created_at: int
    response_id: str
    response: Response | None  # the final response, once the task has ended
    object: str = "task"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Task:
        response = data.get("response")
        return cls(
            id=data["id"],
            status=data["status"],
            created_at=data["created_at"],
            response_id=data["response_id"],
            response=Response.from_json(response) if response is not None else None,
            object=data.get("object", "task"),
        )


@dataclass(frozen=True)
class Model:
    id: str
    capabilities: list[str]
    context_window: int
    backend: str
    device: str
    loaded: bool
    object: str = "model"
    # Where the service found it (`embedded`, `model-dir`, `ollama`, `huggingface`, `lmstudio`).
    source: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Model:
        return cls(
            id=data["id"],
            capabilities=data["capabilities"],
            context_window=data["context_window"],
            backend=data["backend"],
            device=data["device"],
            loaded=data["loaded"],
            object=data.get("object", "model"),
            source=data.get("source"),
        )
