"""A small Python client for LMSP services: sync calls and parsed event streams."""

from .sse import iter_events

__all__ = ["iter_events"]
