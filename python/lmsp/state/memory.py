"""The embedded task events (`memory:`, the default): each task's ring, in the process that
runs it."""

from __future__ import annotations

from ..events import InProcessEvents, TaskEvents
from .backend import Backend, StateConfig

__all__ = ["BACKEND"]


def open_events(url: str, config: StateConfig) -> TaskEvents:
    return InProcessEvents()


BACKEND = Backend(events=open_events)
