"""The shared task events (`redis://…`): Redis Streams every replica reads. Imported only when
asked for: redis is the `replicas` extra."""

from __future__ import annotations

import redis

from ..events import TaskEvents
from ..events.redis import RedisEvents
from ..events.residency import Residency
from ..events.residency_redis import RedisResidency
from .backend import Backend, StateConfig, StateError, without_password

__all__ = ["BACKEND"]


def open_events(url: str, config: StateConfig) -> TaskEvents:
    # Refused now, not at the first task: a replica that cannot reach Redis must not start.
    try:
        with redis.Redis.from_url(url) as probe:
            probe.ping()
    except (redis.RedisError, ValueError) as exc:
        raise StateError(f"cannot reach {without_password(url)}: {exc}") from None
    return RedisEvents(
        url,
        max_events=config.task_events_max,
        max_bytes=config.task_events_bytes,
        retention=config.task_retention,
        lease=config.task_lease,
    )


def open_residency(url: str, config: StateConfig) -> Residency:
    return RedisResidency(url)  # reached at first use: open_events checked Redis answers


BACKEND = Backend(events=open_events, residency=open_residency, shared=True)
