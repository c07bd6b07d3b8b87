"""One replica's view of one task's Redis stream, shared by all of that replica's readers.

Each entry is one event: its id is the SSE id (`N-0`), field `f` its wire frame as the owner's
ring made it, and field `e` marks the final one. The follower reads what the stream keeps
(`XREAD` from 0), then follows it (`XREAD BLOCK`), so Redis sends each event to a replica
once however many clients there read it. It keeps the frames within the ring's own bounds
(the owner trims the stream to its ring with `MINID`), so a resume point the owner's ring
dropped is dropped here too: 410, as in one process.

Redis may lose what it held (a restart without persistence, FLUSHALL, a failover to a replica
that lagged): the owner writes the task's events again from its ring, and this follower goes
on after the last id it read. Only when the stream ends (a final event) at or below that id,
so that nothing after it will ever come, is the follower `lost`: its readers get 410
event_history_expired (GET the task for its result), never a wait for ever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from lmsp._core import EventHistoryExpired

__all__ = ["FINAL_FIELD", "FRAME_FIELD", "Entry", "StreamFollower", "entries", "entry_id", "stream_entries"]

log = logging.getLogger(__name__)

FRAME_FIELD = b"f"
FINAL_FIELD = b"e"
_BATCH = 4096
# A blocked XREAD comes back this often with nothing: well within the client's socket
# timeout (redis-py's default is 5 s), so that only a dead connection times out.
_BLOCK_MS = 2000
_RETRY_S = 0.2


def entry_id(event_id: int) -> str:
    return f"{event_id}-0"


# A stream entry as this project's clients get it: (id, fields), all bytes. redis-py types its
# replies for every client setting; ours never decode responses, so bytes is what comes.
Entry = tuple[bytes, dict[bytes, bytes]]


def entries(reply: object) -> list[Entry]:
    """An XRANGE / XREVRANGE reply's entries."""
    return cast("list[Entry]", reply)


def stream_entries(reply: object) -> list[Entry]:
    """The entries of the one stream an XREAD asked for."""
    return cast("list[tuple[bytes, list[Entry]]]", reply)[0][1]


class StreamFollower:
    def __init__(self, redis: Redis, key: str, *, max_events: int, max_bytes: int) -> None:
        self._redis = redis
        self._key = key
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._frames: list[bytes] = []
        self._start = 0  # index in _frames of the oldest kept frame (id first_id)
        self._bytes = 0
        self._wakers: list[Callable[[], object]] = []
        self.first_id = 1
        self.last_id = 0
        self.closed = False
        self.lost = False  # the stream was rewritten below what this follower read
        self.deleted = False  # its response was deleted (`expire`)

    # --- EventSource -------------------------------------------------------------------------

    def frames_after(self, after: int, limit: int | None = None) -> tuple[int, bytes]:
        if self.deleted and after < self.last_id:
            raise EventHistoryExpired(f"the events after {after} were deleted with their response")
        if self.lost:
            raise EventHistoryExpired(
                f"the shared event log lost the events after {after}; GET the task for its result"
            )
        if after < self.first_id - 1:
            raise EventHistoryExpired(f"events after {after} are no longer kept (the oldest kept is {self.first_id})")
        if after >= self.last_id:
            return self.last_id, b""
        start = self._start + after + 1 - self.first_id
        if limit is None:
            return self.last_id, b"".join(self._frames[start:])
        # As the ring's bounded read: whole frames within `limit`, the first one always.
        end, size = start + 1, len(self._frames[start])
        while end < len(self._frames) and size + len(self._frames[end]) <= limit:
            size += len(self._frames[end])
            end += 1
        return after + end - start, b"".join(self._frames[start:end])

    def wait(self, after: int, waker: Callable[[], object]) -> bool:
        if self.closed or self.last_id > after:
            return False
        self._wakers.append(waker)
        return True

    def expire(self) -> None:
        """Its response was deleted (issue 28): the frames go now, and its readers end as the
        owner's do when it expires the ring: one not at the end gets event_history_expired (its
        next read), one at the end the end; the following stops after its current read."""
        self._frames, self._start, self._bytes = [], 0, 0
        self.first_id = self.last_id + 1
        self.deleted = self.closed = True
        wakers, self._wakers = self._wakers, []
        for waker in wakers:
            waker()

    # --- following -----------------------------------------------------------------------------

    async def catch_up(self) -> None:
        """Reads everything the stream holds now, without waiting."""
        while not self.closed:
            reply = await self._redis.xread({self._key: entry_id(self.last_id)}, count=_BATCH)
            if not reply:
                return
            self._add(stream_entries(reply))

    async def follow(self) -> None:
        """Reads new events as they come, until the final one. Readers hold this follower:
        it outlives a lost connection (the next XREAD picks up after the last id it has)."""
        while not self.closed:
            try:
                reply = await self._redis.xread({self._key: entry_id(self.last_id)}, count=_BATCH, block=_BLOCK_MS)
                if not reply:
                    await self._check_rewritten()
            except RedisError as exc:
                log.warning("reading %s: %s; again in %s s", self._key, exc, _RETRY_S)
                await asyncio.sleep(_RETRY_S)
                continue
            if reply:
                self._add(stream_entries(reply))

    async def _check_rewritten(self) -> None:
        """After a quiet block: a stream that ended at or below the last id read lost the
        events this follower read (see the module's notes)."""
        newest = cast("list[Entry]", await self._redis.xrevrange(self._key, count=1))
        if not newest:
            return
        raw_id, fields = newest[0]
        if FINAL_FIELD in fields and int(raw_id.partition(b"-")[0]) <= self.last_id:
            log.warning("%s ended below the %d events read here: its history was lost", self._key, self.last_id)
            self.lost = self.closed = True
            wakers, self._wakers = self._wakers, []
            for waker in wakers:
                waker()

    def _add(self, added: list[Entry]) -> None:
        for raw_id, fields in added:
            event_id = int(raw_id.partition(b"-")[0])
            if event_id != self.last_id + 1:
                # Trimmed before this replica read it (the stream's start, or a follower that
                # fell behind the owner's ring): what came before is gone here too.
                self._frames, self._start, self._bytes = [], 0, 0
                self.first_id = event_id
            frame = fields[FRAME_FIELD]
            self._frames.append(frame)
            self._bytes += len(frame)
            self.last_id = event_id
            if FINAL_FIELD in fields:
                self.closed = True
        self._trim()
        wakers, self._wakers = self._wakers, []
        for waker in wakers:
            waker()

    def _trim(self) -> None:
        """The ring's bounds: at most max_events frames and max_bytes bytes, the newest kept."""
        frames = self._frames
        while (len(frames) - self._start > self._max_events) or (
            self._bytes > self._max_bytes and len(frames) - self._start > 1
        ):
            self._bytes -= len(frames[self._start])
            self._start += 1
            self.first_id += 1
        if self._start > 1024 and self._start * 2 > len(frames):
            del frames[: self._start]
            self._start = 0
