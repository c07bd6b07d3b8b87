"""Which replica holds which models and conversations, published through the event engine.

Each replica that routes (`--advertise-url`) writes one entry about itself, a `Residence`: the
URL its siblings reach it at, the models it has loaded (or is loading), whether it is busy
(draining, or a model's queue full), and the keys of the conversations it served last
(http/affinity.py: opaque hashes, whose prompt states it likely holds in memory). The entry
lives `ttl` seconds unless written again: a replica that dies (`kill -9`, a lost machine)
drops out of its siblings' view by itself.

Two backends answer one interface (`Residency`), as for task events: `InProcessResidency`
(a `Board` in this process: one process has no sibling to route to; the contract suite puts
two replicas on one board) and `RedisResidency` (events/residency_redis.py: a key per replica
with a TTL in the Redis every replica already shares for task events). Who reads the entries
and forwards requests is http/forward.py; nothing here knows a request.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson

__all__ = ["DEFAULT_RESIDENCY_TTL", "KEY_CHARS", "MAX_KEYS", "Board", "InProcessResidency", "Residence", "Residency"]

# An entry not written again for this long is gone: a dead replica stops being a forwarding
# target within it (and a request forwarded to it meanwhile finds it refused: served locally).
DEFAULT_RESIDENCY_TTL = 3.0
# A conversation key's hex digits (128 bits: unrelated conversations never share one), and how
# many an entry holds: every replica reads every entry each beat, so an entry stays ~9 KB.
KEY_CHARS = 32
MAX_KEYS = 256
_KEY = re.compile(f"[0-9a-f]{{{KEY_CHARS}}}")


@dataclass(frozen=True)
class Residence:
    replica: str  # a random id, given again at each start; what `lmsp-served-by` says
    url: str  # where siblings send what they forward (http://host:port)
    models: tuple[str, ...] = ()  # loaded or being loaded
    busy: bool = False  # draining, or a loaded model's queue is full: forward nothing to it
    keys: tuple[str, ...] = ()  # the conversations it served last, oldest first (at most MAX_KEYS)

    def encode(self) -> bytes:
        return orjson.dumps(
            {"replica": self.replica, "url": self.url, "models": self.models, "busy": self.busy, "keys": self.keys}
        )

    @classmethod
    def decode(cls, raw: bytes) -> Residence | None:
        """An entry as written by `encode`; None for anything else (a foreign or older writer's
        entry is skipped, never trusted half-read)."""
        try:
            data: Any = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(data, dict):
            return None
        replica, url, models, busy = data.get("replica"), data.get("url"), data.get("models"), data.get("busy")
        keys = data.get("keys")
        if not (isinstance(replica, str) and isinstance(url, str) and isinstance(busy, bool)):
            return None
        if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
            return None
        if not isinstance(keys, list) or len(keys) > MAX_KEYS:
            return None
        if not all(isinstance(k, str) and _KEY.fullmatch(k) for k in keys):
            return None
        if not url.startswith(("http://", "https://")):
            return None
        return cls(replica, url, tuple(models), busy, tuple(keys))


class Residency(Protocol):
    @property
    def ttl(self) -> float:
        """Seconds an entry lives unless written again."""
        ...

    async def announce(self, mine: Residence) -> None:
        """Writes this replica's entry (replacing its last one), alive for `ttl` from now."""
        ...

    async def withdraw(self, replica: str) -> None:
        """Removes this replica's entry at once (it is stopping)."""
        ...

    async def entries(self) -> list[Residence]:
        """Every live entry, this replica's own included."""
        ...

    async def aclose(self) -> None: ...


class Board:
    """Where in-process residencies write: one per process by default, shared on purpose by
    the contract suite's two "replicas"."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.entries: dict[str, tuple[float, bytes]] = {}  # replica -> (expires at, entry)


class InProcessResidency:
    def __init__(self, board: Board | None = None, ttl: float = DEFAULT_RESIDENCY_TTL) -> None:
        self.board = board or Board()
        self.ttl = ttl

    async def announce(self, mine: Residence) -> None:
        self.board.entries[mine.replica] = (self.board.clock() + self.ttl, mine.encode())

    async def withdraw(self, replica: str) -> None:
        self.board.entries.pop(replica, None)

    async def entries(self) -> list[Residence]:
        now = self.board.clock()
        for replica in [r for r, (until, _) in self.board.entries.items() if until <= now]:
            del self.board.entries[replica]
        return [e for _, raw in self.board.entries.values() if (e := Residence.decode(raw)) is not None]

    async def aclose(self) -> None:
        pass
