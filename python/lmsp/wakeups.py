"""Wake-ups a writer thread sends to event loops: held back while it writes a batch of events,
and sent without handing the loop the GIL.

The scheduler appends one token to each of its sequences' logs per step. With
`loop.call_soon_threadsafe` at each append, the wake-up's own socket write releases the GIL;
the woken loop takes it, runs the readers' socket writes, and only then hands it back, so its
work sits in the gap between two decodes, where ggml's threads idle (measured: 0.3-0.8 ms a
step on 2 cores). So the scheduler `hold`s its wake-ups from sampling until just before its
next decode and `release`s them there; each loop gets one byte down a pipe of its own, written
by a libc call that keeps the GIL. The loop wakes and takes the GIL as soon as the decode
drops it: its work overlaps the decode instead of delaying it.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import logging
import os
import threading
import weakref
from collections.abc import Callable

__all__ = ["Channel", "channel", "hold", "release"]

# `write(2)` called with the GIL held (a PyDLL function does not release it): the pipe is
# non-blocking, so the call takes microseconds whatever the reader does.
_write = ctypes.PyDLL(None).write
_write.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
_write.restype = ctypes.c_ssize_t

log = logging.getLogger(__name__)
_local = threading.local()
_channels: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Channel] = weakref.WeakKeyDictionary()


class Channel:
    """One loop's door for callbacks from other threads: a pipe the loop reads, and the
    callbacks queued behind it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._read, self._write = os.pipe()  # not inherited by children (PEP 446)
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        self._callbacks: collections.deque[Callable[[], None]] = collections.deque()
        loop.add_reader(self._read, self._run)
        weakref.finalize(loop, _close, self._read, self._write)

    def post(self, callback: Callable[[], None]) -> None:
        """Runs `callback` on the loop: soon, or at this thread's `release` while it holds."""
        held: set[Channel] | None = getattr(_local, "held", None)
        self._callbacks.append(callback)  # a deque's append is atomic: any thread may post
        if held is None:
            self.ring()
        else:
            held.add(self)

    def ring(self) -> None:
        """Wakes the loop to run what was posted."""
        _write(self._write, b"\0", 1)  # a full pipe already rings: EAGAIN is fine

    def _run(self) -> None:
        try:
            os.read(self._read, 4096)
        except BlockingIOError:
            pass
        callbacks = self._callbacks
        while callbacks:
            try:
                callbacks.popleft()()
            except Exception:  # one reader's failure must not strand the others' wake-ups
                log.exception("a wake-up callback failed")


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


def channel(loop: asyncio.AbstractEventLoop) -> Channel:
    """The loop's channel; call it on the loop's own thread (it registers a reader there)."""
    found = _channels.get(loop)
    if found is None:
        found = _channels[loop] = Channel(loop)
    return found


def hold() -> None:
    """From now on this thread's posts wait for its `release`."""
    if getattr(_local, "held", None) is None:
        _local.held = set()


def release() -> None:
    """Rings every channel posted to since `hold`, once each, and stops holding."""
    held: set[Channel] | None = getattr(_local, "held", None)
    _local.held = None
    if held:
        for ch in held:
            ch.ring()
