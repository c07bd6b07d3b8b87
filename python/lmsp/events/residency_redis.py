"""Residency in the Redis the replicas share for task events (`--events redis://…`): one key
per replica, `lmsp:replica:<id>`, holding its `Residence` as JSON, written with `SET … PX` so
that Redis forgets it `ttl` after the last write. Reading is `SCAN` over those keys and one
`MGET`: a fleet is a handful of keys, read by each replica a few times a second.

Every command is bounded (`_SOCKET_TIMEOUT_S`); a failure is the caller's to retry at its next
beat (http/forward.py), and while it lasts the caller routes nothing (it serves locally)."""

from __future__ import annotations

from redis.asyncio import Redis

from .residency import DEFAULT_RESIDENCY_TTL, Residence

__all__ = ["RedisResidency"]

# A beat is short: a stalled Redis must not hold the residency loop for longer than an entry lives.
_SOCKET_TIMEOUT_S = 1.0
_SCAN_COUNT = 256


class RedisResidency:
    def __init__(self, url: str, ttl: float = DEFAULT_RESIDENCY_TTL, namespace: str = "lmsp") -> None:
        """`namespace`: the keys' prefix (tests keep theirs apart on one Redis)."""
        self.ttl = ttl
        self._prefix = f"{namespace}:replica:"
        self._redis: Redis = Redis.from_url(
            url, socket_timeout=_SOCKET_TIMEOUT_S, socket_connect_timeout=_SOCKET_TIMEOUT_S, max_connections=4
        )

    async def announce(self, mine: Residence) -> None:
        await self._redis.set(self._prefix + mine.replica, mine.encode(), px=max(1, int(self.ttl * 1000)))

    async def withdraw(self, replica: str) -> None:
        await self._redis.delete(self._prefix + replica)

    async def entries(self) -> list[Residence]:
        keys = [key async for key in self._redis.scan_iter(match=self._prefix + "*", count=_SCAN_COUNT)]
        if not keys:
            return []
        values = await self._redis.mget(keys)
        return [e for raw in values if isinstance(raw, bytes) and (e := Residence.decode(raw)) is not None]

    async def aclose(self) -> None:
        await self._redis.aclose()
