"""The shared task event log: Redis Streams (`--events redis://…`), for several replicas.

The replica that runs a task (its owner) copies the frames its ring made to the task's
stream (`XADD`, the SSE id as entry id, trimmed with `MINID` to what the ring keeps, so the
stream's bounds are the ring's: events and bytes), gives the stream the retention time as a
TTL once the final event is in, and renews a lease key while the task runs. Every replica,
the owner included, reads tasks through a `StreamFollower`: a client that read event N from
one replica can resume after N from any.

Cancelling goes over a pub/sub channel every replica listens to; the owner cancels its run.
A task whose lease expired (its owner died) is ended `failed` by the first replica that
claims it (service/tasks.py decides when; here is how).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.exceptions import ConnectionError, RedisError, ResponseError, TimeoutError

from lmsp._core import EventHistoryExpired, EventLog

from ..protocol import events as ev
from ..protocol.errors import ProblemError
from .base import DEFAULT_LEASE
from .follower import FINAL_FIELD, FRAME_FIELD, StreamFollower, entries, entry_id
from .wait import wait_for_events

__all__ = ["DEFAULT_LEASE", "RedisEvents"]

log = logging.getLogger(__name__)

_CANCEL_CHANNEL = "lmsp:cancel"
_RETRY_S = 0.2
# Each task followed on this replica holds a connection in XREAD BLOCK; past this many, a
# command waits for one to come free (up to _POOL_WAIT_S) instead of failing at once.
_MAX_CONNECTIONS = 1024
_POOL_WAIT_S = 10
# The event lines that end a stream: what `seal` appends before it closes the ring.
_FINAL_LINES = frozenset(f"event: {name}".encode() for name in ev.FINAL_EVENTS)


def _is_final(frame: bytes) -> bool:
    return frame.split(b"\n", 2)[1] in _FINAL_LINES


@asynccontextmanager
async def _reachable() -> AsyncIterator[None]:
    """A request that needs Redis while it is away is answered 503, not 500."""
    try:
        yield
    except RedisError as exc:
        raise ProblemError("service_unavailable", f"the shared event log is unreachable: {exc}") from None


def _stream(task_id: str) -> str:
    return f"lmsp:task:{task_id}:events"


def _lease(task_id: str) -> str:
    return f"lmsp:task:{task_id}:lease"


def _claim(task_id: str) -> str:
    return f"lmsp:task:{task_id}:takeover"


class RedisEvents:
    def __init__(
        self, url: str, *, max_events: int, max_bytes: int, retention: float, lease: float = DEFAULT_LEASE
    ) -> None:
        self.url = url
        self.lease = lease
        self.replica = uuid.uuid4().hex  # the lease's value: who holds it, for a person looking
        self._redis: Redis = Redis(
            connection_pool=BlockingConnectionPool.from_url(url, max_connections=_MAX_CONNECTIONS, timeout=_POOL_WAIT_S)
        )
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._retention_ms = max(1, int(retention * 1000))
        self._cancels: dict[str, Callable[[], None]] = {}  # this replica's running tasks
        self._mirrors: set[asyncio.Task[None]] = set()
        # The followers of tasks read on this replica, once each has read what its stream holds.
        self._caught_up: dict[str, asyncio.Future[StreamFollower]] = {}
        self._following: set[asyncio.Task[None]] = set()
        self._listener: asyncio.Task[None] | None = None
        self._pubsub: PubSub | None = None

    async def start(self) -> None:
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(_CANCEL_CHANNEL)
        self._listener = asyncio.ensure_future(self._listen(self._pubsub))

    async def _listen(self, pubsub: PubSub) -> None:
        while True:
            try:
                async for message in pubsub.listen():
                    cancel = self._cancels.get(message["data"].decode())
                    if cancel is not None:
                        cancel()
            except (ConnectionError, TimeoutError) as exc:
                # The client subscribes again as it reconnects; a cancel sent meanwhile is
                # sent again by its replica (service/tasks.py).
                log.warning("cancel channel: %s; listening again in %s s", exc, _RETRY_S)
                await asyncio.sleep(_RETRY_S)

    # --- the owner's side ----------------------------------------------------------------

    async def publish(self, task_id: str, ring: EventLog, cancel: Callable[[], None]) -> None:
        # The lease exists before the task's record does: no replica can find the task
        # running and unleased while it starts.
        async with _reachable():
            await self._redis.set(_lease(task_id), self.replica, px=int(self.lease * 1000))
        self._cancels[task_id] = cancel
        mirror = asyncio.ensure_future(self._mirror(task_id, ring))
        self._mirrors.add(mirror)
        mirror.add_done_callback(self._mirrors.discard)

    async def _mirror(self, task_id: str, ring: EventLog) -> None:
        """Copies the ring's frames to the stream as they come, batch by batch (one round
        trip per batch: a reader that fell behind the model gets a batch per wake-up)."""
        key, lease_key = _stream(task_id), _lease(task_id)
        renew_every = self.lease / 3
        renew_at = time.monotonic() + renew_every
        cursor = 0
        try:
            while True:
                try:
                    last, frames = ring.frames_after(cursor)
                except EventHistoryExpired:
                    # Redis fell a whole ring behind the model: those events are lost to
                    # readers everywhere, who get 410 as from the ring itself.
                    cursor = ring.first_id - 1
                    continue
                # Each frame ends with the blank line that no frame holds inside. The final
                # event is known by its name (the ring may close just after this read).
                parts = frames.split(b"\n\n")[:-1]
                final = bool(parts) and _is_final(parts[-1])
                pipe = self._redis.pipeline(transaction=False)
                if parts:
                    for i, part in enumerate(parts, start=cursor + 1):
                        fields = {FRAME_FIELD: part + b"\n\n"}
                        if final and i == last:
                            fields[FINAL_FIELD] = b"1"
                        trim = entry_id(ring.first_id) if i == last else None
                        pipe.xadd(key, fields, id=entry_id(i), minid=trim, approximate=False)  # type: ignore[arg-type]
                if final:
                    pipe.pexpire(key, self._retention_ms)
                    pipe.delete(lease_key)
                elif time.monotonic() >= renew_at:
                    pipe.set(lease_key, self.replica, px=int(self.lease * 1000))
                    renew_at = time.monotonic() + renew_every
                if len(pipe):
                    try:
                        await pipe.execute()
                    except (ConnectionError, TimeoutError) as exc:
                        # Some of the batch may be in: go on after what the stream holds.
                        log.warning("task %s: writing its events: %s; again in %s s", task_id, exc, _RETRY_S)
                        await asyncio.sleep(_RETRY_S)
                        cursor = max(cursor, await self._newest(key))
                        continue
                cursor = last
                if final:
                    return
                if not parts:
                    await wait_for_events(ring, cursor, renew_every)
        except ResponseError as exc:
            # An id the stream already has: another replica found the lease expired and ended
            # the task (this replica stalled longer than the lease). Its end stands.
            log.warning("task %s was ended by another replica (%s); cancelling it here", task_id, exc)
            cancel = self._cancels.get(task_id)
            if cancel is not None:
                cancel()
        except RedisError:
            # Redis is gone for longer than a retry: the lease lapses, and another replica
            # ends the task failed for its readers there.
            log.exception("task %s: lost Redis; its events stop here", task_id)
        finally:
            self._cancels.pop(task_id, None)

    # --- every replica's side --------------------------------------------------------------

    async def source(self, task_id: str, final: bool) -> StreamFollower | None:
        async with _reachable():
            caught_up = self._caught_up.get(task_id)
            if caught_up is None:
                if final and not await self._redis.exists(_stream(task_id)):
                    return None  # expired: the task's record answers
                caught_up = self._caught_up.get(task_id)  # begun by another reader meanwhile
            if caught_up is None:
                caught_up = self._start_following(task_id)
            # Shielded: a reader that leaves while the stream is read does not stop it for others.
            return await asyncio.shield(caught_up)

    def _start_following(self, task_id: str) -> asyncio.Future[StreamFollower]:
        follower = StreamFollower(self._redis, _stream(task_id), max_events=self._max_events, max_bytes=self._max_bytes)
        caught_up: asyncio.Future[StreamFollower] = asyncio.get_running_loop().create_future()
        self._caught_up[task_id] = caught_up
        following = asyncio.ensure_future(self._follow(task_id, follower, caught_up))
        self._following.add(following)
        following.add_done_callback(self._following.discard)
        return caught_up

    async def _follow(self, task_id: str, follower: StreamFollower, caught_up: asyncio.Future[StreamFollower]) -> None:
        """Reads what the stream holds (then `caught_up` answers its readers), follows it to
        the end, and keeps the frames as long as the stream keeps them."""
        left_ms = 0
        try:
            await follower.catch_up()
            caught_up.set_result(follower)
            await follower.follow()
            left_ms = await self._redis.pttl(_stream(task_id))
        except RedisError as exc:
            if not caught_up.done():
                caught_up.set_exception(exc)
        finally:
            if not caught_up.done():  # stopped (shutdown) before it had read the stream
                caught_up.cancel()
            if not follower.closed:  # dropped now: the next reader reads the stream afresh
                self._forget(task_id, caught_up)
        asyncio.get_running_loop().call_later(max(left_ms, 0) / 1000, self._forget, task_id, caught_up)

    def _forget(self, task_id: str, caught_up: asyncio.Future[StreamFollower]) -> None:
        if self._caught_up.get(task_id) is caught_up:  # not a newer follower of the same task
            del self._caught_up[task_id]

    async def newest(self, task_id: str, source: object) -> int:
        async with _reachable():
            return await self._newest(_stream(task_id))

    async def _newest(self, key: str) -> int:
        newest = entries(await self._redis.xrevrange(key, count=1))
        return int(newest[0][0].partition(b"-")[0]) if newest else 0

    async def request_cancel(self, task_id: str) -> None:
        async with _reachable():
            await self._redis.publish(_CANCEL_CHANNEL, task_id)

    async def abandoned(self, task_ids: list[str]) -> list[str]:
        if not task_ids:
            return []
        leased = await self._redis.mget([_lease(t) for t in task_ids])
        return [t for t, holder in zip(task_ids, leased, strict=True) if holder is None]

    async def take_over(self, task_id: str) -> tuple[int, bool] | None:
        # The claim outlives the lease: a second replica, sweeping meanwhile, leaves it be.
        if not await self._redis.set(_claim(task_id), self.replica, nx=True, px=int(self.lease * 6000)):
            return None
        newest = entries(await self._redis.xrevrange(_stream(task_id), count=1))
        if not newest:
            return 0, False
        raw_id, fields = newest[0]
        return int(raw_id.partition(b"-")[0]), FINAL_FIELD in fields

    async def append_final(self, task_id: str, event_id: int, frame: bytes) -> None:
        key = _stream(task_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.xadd(key, {FRAME_FIELD: frame, FINAL_FIELD: b"1"}, id=entry_id(event_id))
        pipe.pexpire(key, self._retention_ms)
        await pipe.execute()

    async def aclose(self, grace: float = 2.0) -> None:
        """Lets the mirrors send what their rings still hold (the final events of runs the
        shutdown ended), then stops following and closes the connections."""
        if self._mirrors:
            await asyncio.wait(list(self._mirrors), timeout=grace)
        for task in [*self._mirrors, *self._following, *([self._listener] if self._listener else [])]:
            task.cancel()
        await asyncio.gather(
            *self._mirrors, *self._following, *([self._listener] if self._listener else []), return_exceptions=True
        )
        if self._pubsub is not None:
            await self._pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
        await self._redis.aclose(close_connection_pool=True)  # the pool is ours: made in __init__
