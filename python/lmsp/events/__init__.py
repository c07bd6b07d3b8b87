"""Where tasks' events are kept for their readers: in this process (the default,
events/inprocess.py) or in Redis Streams shared by several replicas (events/redis.py, imported
only when asked for: redis is the `replicas` extra). Both answer one interface (`TaskEvents`);
which one serves is state/'s choice."""

from __future__ import annotations

from .base import DEFAULT_LEASE, DEFAULT_RETENTION, DEFAULT_TASK_BYTES, DEFAULT_TASK_EVENTS, EventSource, TaskEvents
from .inprocess import InProcessEvents

__all__ = [
    "DEFAULT_LEASE",
    "DEFAULT_RETENTION",
    "DEFAULT_TASK_BYTES",
    "DEFAULT_TASK_EVENTS",
    "EventSource",
    "InProcessEvents",
    "TaskEvents",
]
