"""The embedded task events (`memory:`, the default): each task's ring, in the process that
runs it."""

from __future__ import annotations

from ..events import InProcessEvents, TaskEvents
from ..events.residency import InProcessResidency, Residency
from .backend import Backend, StateConfig

__all__ = ["BACKEND"]


def open_events(url: str, config: StateConfig) -> TaskEvents:
    return InProcessEvents()


def open_residency(url: str, config: StateConfig) -> Residency:
    return InProcessResidency()  # no sibling in this process: nothing is ever routed


BACKEND = Backend(events=open_events, residency=open_residency)
