"""Where tasks' events are kept for their readers: in this process (the default) or in Redis
Streams shared by several replicas (events/redis.py, imported only when asked for: redis is
the `replicas` extra)."""

from __future__ import annotations

from .base import EventSource, InProcessEvents, TaskEvents

__all__ = ["EventSource", "InProcessEvents", "TaskEvents"]
