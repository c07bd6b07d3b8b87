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

Redis is a copy that catches up; the owner's ring is the truth (docs/operations/replica-faults.md):
- the mirror retries every failure (connection lost, timeouts, READONLY after a failover, OOM,
  LOADING) with backoff for as long as the ring holds the task's frames, each time from the
  last id Redis holds (after a restart without persistence or a FLUSHALL: from the ring's
  oldest frame; readers asking for what neither keeps get 410). Only an id the stream already
  has, under a final event this replica did not write, is another replica's takeover;
- leases are renewed by a loop of their own, every third of a lease, for every task running
  here; a sibling's lease counts as lapsed only once seen missing for a whole lease, and not
  within a lease of this replica's own trouble with Redis (its reads could not be trusted);
- readers on the owner read its ring; elsewhere a follower that finds the stream behind what
  it read (history rewritten after data loss) ends its readers with 410;
- every command has a socket timeout: a stalled Redis is an error after `_SOCKET_TIMEOUT_S`,
  answered 503 to a request, retried by the loops.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from lmsp._core import EventHistoryExpired, EventLog

from ..protocol import events as ev
from ..protocol.errors import unavailable
from .base import DEFAULT_LEASE, EventSource
from .follower import FINAL_FIELD, FRAME_FIELD, StreamFollower, entries, entry_id
from .wait import wait_for_events

__all__ = ["DEFAULT_LEASE", "RedisEvents"]

log = logging.getLogger(__name__)

_CANCEL_CHANNEL = "lmsp:cancel"
# A task whose events were deleted (`unpublish`): every replica drops its copy, so that a reader
# already attached to one ends now, not when it leaves (issue 28).
_DELETED_CHANNEL = "lmsp:deleted"
_RETRY_S = 0.2
# The mirror's backoff while Redis is away: first wait, longest wait.
_BACKOFF_S = (0.1, 2.0)
# Every command's reply is awaited at most this long (XREAD BLOCK waits 2 s of it, follower.py):
# a stalled Redis is an error, not a hang; connecting gets as long.
_SOCKET_TIMEOUT_S = 5.0
# The error Redis answers an XADD whose id is not above the stream's last: the stream has it.
_DUPLICATE = "equal or smaller than the target stream top item"
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
    """A request that needs Redis while it is away is answered 503 with Retry-After, not 500;
    the error (with Redis's address) goes to the log, not to the client."""
    try:
        yield
    except RedisError as exc:
        log.warning("the shared event log: %s", exc)
        raise unavailable("the shared event log") from None


def _expire_follower(caught_up: asyncio.Future[StreamFollower]) -> None:
    """Ends the readers of a copy whose response was deleted, once it has been read in."""
    if not caught_up.cancelled() and caught_up.exception() is None:
        caught_up.result().expire()


class _TakenOver(Exception):
    """Another replica ended this task (the stream's evidence: see `_taken_over`)."""


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
            connection_pool=BlockingConnectionPool.from_url(
                url,
                max_connections=_MAX_CONNECTIONS,
                timeout=_POOL_WAIT_S,
                socket_timeout=_SOCKET_TIMEOUT_S,
                socket_connect_timeout=_SOCKET_TIMEOUT_S,
                socket_keepalive=True,
            )
        )
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._retention_ms = max(1, int(retention * 1000))
        self._cancels: dict[str, Callable[[], None]] = {}  # this replica's running tasks
        self._mirror_of: dict[str, asyncio.Task[None]] = {}
        self._rings: dict[str, EventLog] = {}  # the tasks published here, while their rings live
        self._leases: set[str] = set()  # running here: the lease loop renews them
        self._leasing: asyncio.Task[None] | None = None
        # Since when each sibling's task was seen unleased, and when this replica last had
        # trouble reaching Redis (see `abandoned`).
        self._missing_since: dict[str, float] = {}
        self._trouble_at = -math.inf
        self._closing = False
        self._mirrors: set[asyncio.Task[None]] = set()
        # The followers of tasks read on this replica, once each has read what its stream holds.
        self._caught_up: dict[str, asyncio.Future[StreamFollower]] = {}
        self._following: set[asyncio.Task[None]] = set()
        self._listener: asyncio.Task[None] | None = None
        self._pubsub: PubSub | None = None

    async def start(self) -> None:
        self._pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        await self._pubsub.subscribe(_CANCEL_CHANNEL, _DELETED_CHANNEL)
        self._listener = asyncio.ensure_future(self._listen(self._pubsub))
        self._leasing = asyncio.ensure_future(self._renew_leases())

    async def _listen(self, pubsub: PubSub) -> None:
        while not self._closing:
            try:
                async for message in pubsub.listen():
                    data = message.get("data")
                    # Anyone who can reach Redis can publish here: what is not a task id of
                    # ours is ignored, never a reason to stop listening.
                    if not isinstance(data, bytes):
                        continue
                    if message.get("channel") == _DELETED_CHANNEL.encode():
                        self._drop_copy(data.decode("utf-8", "replace"))
                        continue
                    cancel = self._cancels.get(data.decode("utf-8", "replace"))
                    if cancel is not None:
                        cancel()
            except RedisError as exc:
                if self._closing:  # its connection was closed under it: the end, not trouble
                    return
                # The client subscribes again as it reconnects; a cancel sent meanwhile is
                # sent again by its replica (service/tasks.py).
                self._trouble_at = time.monotonic()
                log.warning("cancel channel: %s; listening again in %s s", exc, _RETRY_S)
                await asyncio.sleep(_RETRY_S)

    async def _renew_leases(self) -> None:
        """Every third of a lease, renews the lease of every task running here, whatever
        their mirrors are doing (a mirror may be waiting out an outage)."""
        while True:
            await asyncio.sleep(self.lease / 3)
            running = list(self._leases)
            if not running:
                continue
            pipe = self._redis.pipeline(transaction=False)
            for task_id in running:
                pipe.set(_lease(task_id), self.replica, px=int(self.lease * 1000))
            try:
                await pipe.execute()
            except RedisError as exc:
                self._trouble_at = time.monotonic()
                log.warning("renewing %d task leases: %s", len(running), exc)

    # --- the owner's side ----------------------------------------------------------------

    async def publish(self, task_id: str, ring: EventLog, cancel: Callable[[], None]) -> None:
        # The lease exists before the task's record does: no replica can find the task
        # running and unleased while it starts.
        async with _reachable():
            await self._redis.set(_lease(task_id), self.replica, px=int(self.lease * 1000))
        self._cancels[task_id] = cancel
        self._leases.add(task_id)
        self._rings = {t: r for t, r in self._rings.items() if not r.expired}
        self._rings[task_id] = ring
        mirror = asyncio.ensure_future(self._mirror(task_id, ring))
        self._mirrors.add(mirror)
        mirror.add_done_callback(self._mirrors.discard)
        self._mirror_of[task_id] = mirror
        mirror.add_done_callback(lambda _: self._mirror_of.pop(task_id, None))

    async def unpublish(self, task_id: str) -> None:
        """Undoes `publish` for a task whose creation failed after it, or whose response was
        deleted: nothing of it is left, here or in another replica's copy."""
        self._cancels.pop(task_id, None)
        self._leases.discard(task_id)
        self._rings.pop(task_id, None)
        mirror = self._mirror_of.pop(task_id, None)
        if mirror is not None:
            mirror.cancel()
        self._drop_copy(task_id)
        try:
            await self._redis.delete(_lease(task_id), _stream(task_id))
            # After the stream is gone: a replica that drops its copy finds none to read again.
            await self._redis.publish(_DELETED_CHANNEL, task_id)
        except RedisError as exc:  # the lease lapses by itself; the sweep finds no record
            log.warning("task %s: removing its lease and stream: %s", task_id, exc)

    def _drop_copy(self, task_id: str) -> None:
        """This replica's copy of a deleted task's events: its readers end (StreamFollower.expire),
        and the next reader asks Redis, which has none. The owner's ring goes too."""
        ring = self._rings.pop(task_id, None)
        if ring is not None:
            ring.expire()
        caught_up = self._caught_up.pop(task_id, None)
        if caught_up is None:
            return
        if caught_up.done():
            _expire_follower(caught_up)
        else:  # still reading what the stream held: ended once it has
            caught_up.add_done_callback(_expire_follower)

    async def _mirror(self, task_id: str, ring: EventLog) -> None:
        """Copies the ring's frames to the stream as they come, batch by batch (one round
        trip per batch: a reader that fell behind the model gets a batch per wake-up), and
        goes on after every failure while the ring still holds the frames."""
        key = _stream(task_id)
        cursor = 0
        backoff = _BACKOFF_S[0]
        final_frame: bytes | None = None  # the final event, once this mirror sent it
        try:
            while not ring.expired:
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
                if not parts:
                    if ring.closed:  # its final event is in Redis
                        return
                    await wait_for_events(ring, cursor, self.lease / 3)
                    continue
                pipe = self._redis.pipeline(transaction=False)
                for i, part in enumerate(parts, start=cursor + 1):
                    fields = {FRAME_FIELD: part + b"\n\n"}
                    if final and i == last:
                        fields[FINAL_FIELD] = b"1"
                        final_frame = fields[FRAME_FIELD]
                    trim = entry_id(ring.first_id) if i == last else None
                    pipe.xadd(key, fields, id=entry_id(i), minid=trim, approximate=False)  # type: ignore[arg-type]
                if final:
                    self._leases.discard(task_id)
                    pipe.pexpire(key, self._retention_ms)
                    pipe.delete(_lease(task_id))
                try:
                    await pipe.execute()
                except RedisError as exc:
                    if _DUPLICATE in str(exc) and await self._taken_over(key, final_frame):
                        raise _TakenOver from None
                    # An outage (or our own batch half in): again, after what the stream holds.
                    self._trouble_at = time.monotonic()
                    log.warning("task %s: writing its events: %s; again in %.1f s", task_id, exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _BACKOFF_S[1])
                    cursor = await self._resume_point(key, cursor)
                    if final:
                        self._leases.add(task_id)
                    continue
                backoff = _BACKOFF_S[0]
                cursor = last
                if final:
                    return
            log.error("task %s: its ring expired before Redis had all its events", task_id)
        except _TakenOver:
            # Another replica found the lease expired and ended the task (this replica
            # stalled longer than the lease). Its end stands.
            log.warning("task %s was ended by another replica; cancelling it here", task_id)
            cancel = self._cancels.get(task_id)
            if cancel is not None:
                cancel()
        finally:
            self._cancels.pop(task_id, None)
            self._leases.discard(task_id)

    async def _resume_point(self, key: str, cursor: int) -> int:
        """Where the mirror goes on from: the last id Redis holds (less than `cursor` after
        data loss: the ring sends the rest again), or `cursor` while Redis cannot say."""
        try:
            return await self._newest(key)
        except RedisError:
            return cursor

    async def _taken_over(self, key: str, ours: bytes | None) -> bool:
        """The stream's own evidence: its last entry is a final event this replica did not
        write (`ours`: the one it sent, if any). Any other duplicate is this replica's own
        batch, half in before an error."""
        try:
            newest = entries(await self._redis.xrevrange(key, count=1))
        except RedisError:
            return False
        if not newest or FINAL_FIELD not in newest[0][1]:
            return False
        return newest[0][1].get(FRAME_FIELD) != ours

    # --- every replica's side --------------------------------------------------------------

    async def source(self, task_id: str, final: bool) -> EventSource | None:
        ring = self._rings.get(task_id)
        if ring is not None and not ring.expired:
            return ring  # the owner's readers read the truth, whatever Redis is doing
        async with _reachable():
            # Asked even when this replica follows the stream already: a stream deleted with
            # its response (DELETE, issue 28) must not stay readable from a replica's copy.
            if final and not await self._redis.exists(_stream(task_id)):
                return None  # expired or deleted: the task's record answers
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
            if not follower.lost:
                left_ms = await self._redis.pttl(_stream(task_id))
        except RedisError as exc:
            if not caught_up.done():
                caught_up.set_exception(exc)
        finally:
            if not caught_up.done():  # stopped (shutdown) before it had read the stream
                caught_up.cancel()
            if not follower.closed or follower.lost:  # dropped now: the next reader reads the stream afresh
                self._forget(task_id, caught_up)
        asyncio.get_running_loop().call_later(max(left_ms, 0) / 1000, self._forget, task_id, caught_up)

    def _forget(self, task_id: str, caught_up: asyncio.Future[StreamFollower]) -> None:
        if self._caught_up.get(task_id) is caught_up:  # not a newer follower of the same task
            del self._caught_up[task_id]

    async def newest(self, task_id: str, source: object) -> int:
        if isinstance(source, EventLog):
            return source.last_id  # the owner's ring: nothing is newer
        async with _reachable():
            return await self._newest(_stream(task_id))

    async def _newest(self, key: str) -> int:
        newest = entries(await self._redis.xrevrange(key, count=1))
        return int(newest[0][0].partition(b"-")[0]) if newest else 0

    async def request_cancel(self, task_id: str) -> None:
        async with _reachable():
            await self._redis.publish(_CANCEL_CHANNEL, task_id)

    async def abandoned(self, task_ids: list[str]) -> list[str]:
        """A lease gap is trusted only once it lasted a whole lease, and not within a lease
        of this replica's own trouble with Redis: a restart, FLUSHALL or failover loses every
        lease at once, and their owners set them again within a third of a lease."""
        if not task_ids:
            return []
        now = time.monotonic()
        try:
            leased = await self._redis.mget([_lease(t) for t in task_ids])
        except RedisError:
            self._trouble_at = now
            raise
        missing = [t for t, holder in zip(task_ids, leased, strict=True) if holder is None]
        self._missing_since = {t: self._missing_since.get(t, now) for t in missing}
        if now - self._trouble_at < self.lease:
            return []
        return [t for t in missing if now - self._missing_since[t] >= self.lease]

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

    async def ping(self) -> None:
        """Bounded by the socket timeout every command has (a stalled Redis is an error). Not
        through `_reachable`: the probe logs a change, not every failed try."""
        await self._redis.ping()

    async def aclose(self, grace: float = 2.0) -> None:
        """Lets the mirrors send what their rings still hold (the final events of runs the
        shutdown ended), then stops following and closes the connections."""
        if self._mirrors:
            await asyncio.wait(list(self._mirrors), timeout=grace)
        self._closing = True
        loops = [t for t in (self._listener, self._leasing) if t is not None]
        tasks = [*self._mirrors, *self._following, *loops]
        for task in tasks:
            task.cancel()
        # Bounded: a task waiting in redis-py's pubsub `listen` may not end when cancelled (two
        # CI runs hung here for the whole test timeout); closing the pubsub below ends it, as
        # `_listen` then sees `_closing`.
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=grace)
            if stuck:
                log.warning("%d event-engine task(s) did not end when cancelled; closing under them", len(stuck))
        if self._pubsub is not None:
            # Through a typed name: redis-py annotates `aclose` from 8.2 on (Python >= 3.11) and not
            # before, and an ignore comment would be unused on one of the two.
            close_pubsub: Callable[[], Awaitable[None]] = self._pubsub.aclose
            await close_pubsub()
        await self._redis.aclose(close_connection_pool=True)  # the pool is ours: made in __init__
