"""How far behind a stream's reader is: bytes handed to granian that the kernel has not taken.

granian's RSGI stream transport queues whatever the app writes in an unbounded channel
(`send_bytes` resolves at once, src/rsgi/io.rs), and offers no way to wait for it to drain.
So the drain is measured instead: the kernel counts what it took from the connection
(`tcpi_bytes_acked` plus the bytes still in its send queue), which the service reads with one
`sock_diag` netlink query for the connection's address pair (what `ss -ti` shows). What the
app handed over, less what the kernel took since the stream began, is what granian still
holds for this reader; `Outflow.room` waits while that is over the bound, and gives up (the
reader is closed) when it does not come back down within the write deadline.

Where the kernel cannot be asked (not Linux, a unix socket), nothing is measured and streams
run as before; `measured` says which.
"""

from __future__ import annotations

import asyncio
import contextvars
import ctypes
import os
import socket
import struct
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["CURRENT", "DEFAULT_STREAM_BUFFER", "DEFAULT_WRITE_TIMEOUT", "Outflow", "ReaderStalled", "TcpCounters"]

DEFAULT_STREAM_BUFFER = 1024 * 1024  # bytes a stream may have queued beyond what its socket took
DEFAULT_WRITE_TIMEOUT = 30.0  # seconds a reader over that may take to come back under half of it

# The request being answered's outflow, set by the app for each request (each RSGI call runs
# in a task of its own, so this is per request); None outside a request or where unmeasured.
CURRENT: contextvars.ContextVar[Outflow | None] = contextvars.ContextVar("lmsp_outflow", default=None)

_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST = 1
_NLM_F_DUMP = 0x300
_NLMSG_ERROR = 2
_NLMSG_DONE = 3
_INET_DIAG_INFO = 2
_EVERY_STATE = 0xFFF  # every state: a half-closed connection is still asked
_CONNECTED = 0xFFF & ~(1 << 10)  # every state but LISTEN
_TCP_LISTEN = 10  # idiag_state of a listening socket
_REPLY_TIMEOUT = 1.0
_RECV_BUFFER = 65536  # a dump's part is at most a page or two
_BYTES_ACKED = 120  # offset of tcpi_bytes_acked in struct tcp_info (since Linux 4.1)


class ReaderStalled(Exception):
    """The reader stayed behind the bound past the write deadline."""


def _address(text: str) -> tuple[str, int] | None:
    """granian's `127.0.0.1:5000` / `[::1]:5000` → (address, port); None for a unix socket."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


# libc's send and recv, called holding the GIL (ctypes.PyDLL). The kernel answers a query at
# once (~20 us), but the socket module releases the GIL around each call, and taking it back
# from the busy generation thread made a query cost ~370 us of the event loop's time (64
# streams, issue 53). MSG_DONTWAIT: a call never blocks holding the GIL; one that would block
# goes through the socket module (and its timeout) instead.
_LIBC = ctypes.PyDLL(None, use_errno=True) if sys.platform == "linux" else None
_MSG_DONTWAIT = 0x40


class TcpCounters:
    """One netlink socket, asked for one connection's counters at a time.

    Each request carries a sequence number of its own and only the reply that carries it back
    is an answer: a reply left unread (a receive that failed or timed out) is dropped when it
    turns up, instead of being taken for the next request's, and every later one's after it."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._seq = 0
        self._buffer = ctypes.create_string_buffer(_RECV_BUFFER)

    def query(self, local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
        """(bytes the kernel took from the app, the socket's inode); None when unknown."""
        family = socket.AF_INET6 if ":" in local[0] else socket.AF_INET
        try:
            src = socket.inet_pton(family, local[0]).ljust(16, b"\0")
            dst = socket.inet_pton(family, remote[0]).ljust(16, b"\0")
        except OSError:
            return None
        sockid = struct.pack("!HH", local[1], remote[1]) + src + dst + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
        for message in self._ask(family, sockid, _NLM_F_REQUEST):
            return _parse(message, local[1], remote[1])
        return None

    def local_of(self, port: int, remote: tuple[str, int]) -> tuple[str, int] | None:
        """The local address of this process's connection on `port` from `remote`: a service
        listening on every address (0.0.0.0, ::) answers each client on the address that
        client reached, which the exact lookup of `query` needs. None when not found."""
        family = socket.AF_INET6 if ":" in remote[0] else socket.AF_INET
        try:
            peer = socket.inet_pton(family, remote[0])
        except OSError:
            return None
        # A dump of the family's connected sockets between these ports (the kernel skips the
        # others), matched here by peer address.
        sockid = struct.pack("!HH", port, remote[1]) + bytes(32) + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
        width = len(peer)
        for message in self._ask(family, sockid, _NLM_F_REQUEST | _NLM_F_DUMP, _CONNECTED):
            sport, dport = struct.unpack_from("!HH", message, 4)
            if (sport, dport) == (port, remote[1]) and message[24 : 24 + width] == peer:
                return socket.inet_ntop(family, message[8 : 8 + width]), port
        return None

    def _ask(self, family: int, sockid: bytes, flags: int, states: int = _EVERY_STATE) -> Iterator[bytes]:
        """Sends one request; yields the inet_diag messages of its reply (those of a dump
        until its end), skipping what answers an earlier request."""
        wanted = 1 << (_INET_DIAG_INFO - 1)
        request = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, wanted, 0, states) + sockid
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        seq = self._seq
        header = struct.pack("=IHHII", 16 + len(request), _SOCK_DIAG_BY_FAMILY, flags, seq, 0)
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG)
                # The kernel answers at once: a reply that does not come is lost, not late.
                self._sock.settimeout(_REPLY_TIMEOUT)
            self._send(self._sock, header + request)
            while True:
                data = self._recv(self._sock)
                offset = 0
                while offset + 16 <= len(data):
                    length, kind, _, got = struct.unpack_from("=IHHI", data, offset)
                    if length < 16:
                        break
                    if got == seq:
                        if kind in (_NLMSG_DONE, _NLMSG_ERROR):  # the end, or no such connection
                            return
                        yield data[offset + 16 : offset + length]
                        if not flags & _NLM_F_DUMP:
                            return
                    offset += (length + 3) & ~3
        except OSError:
            return

    @staticmethod
    def _send(sock: socket.socket, data: bytes) -> None:
        if _LIBC is None or _LIBC.send(sock.fileno(), data, len(data), _MSG_DONTWAIT) < 0:
            sock.send(data)

    def _recv(self, sock: socket.socket) -> bytes:
        got = -1 if _LIBC is None else _LIBC.recv(sock.fileno(), self._buffer, _RECV_BUFFER, _MSG_DONTWAIT)
        return ctypes.string_at(self._buffer, got) if got >= 0 else sock.recv(_RECV_BUFFER)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _parse(message: bytes, local_port: int, remote_port: int) -> tuple[int, int] | None:
    if len(message) < 72:
        return None
    # The kernel looks the address pair up as it would an arriving packet: once the connection
    # is gone, it answers with the socket that would take it, the service's LISTENING socket.
    # Only the connection asked for is an answer (resetting the listener stops the service).
    state = message[1]
    sport, dport = struct.unpack_from("!HH", message, 4)
    if state == _TCP_LISTEN or (sport, dport) != (local_port, remote_port):
        return None
    _, write_queue, _, inode = struct.unpack_from("=IIII", message, 4 + 48 + 4)
    offset = 4 + 48 + 20
    while offset + 4 <= len(message):
        length, kind = struct.unpack_from("=HH", message, offset)
        if length < 4:
            break
        if kind == _INET_DIAG_INFO and length - 4 >= _BYTES_ACKED + 8:
            (acked,) = struct.unpack_from("=Q", message, offset + 4 + _BYTES_ACKED)
            return acked + write_queue, inode
        offset += (length + 3) & ~3
    return None


_COUNTERS = TcpCounters()


def _chunk_framing(size: int) -> int:
    """HTTP/1.1 chunked framing around one frame of `size` bytes: `{size:x}\\r\\n…\\r\\n`."""
    return len(f"{size:x}") + 4


class Outflow:
    """One response's bytes in flight between the app and the kernel.

    The kernel is asked only when the reader may be behind: after a measure found it `b`
    bytes behind, it cannot pass the bound before `window - b` more bytes are handed over
    (the kernel's count only grows), so the next measure waits for that much. A reader that
    keeps up costs one query per window written, not one per write."""

    def __init__(self, scope: Any, limit: int, write_timeout: float, counters: TcpCounters = _COUNTERS) -> None:
        self.limit = limit
        self.window = limit  # the bound now: `narrow` lowers it for a log that is complete
        self.write_timeout = write_timeout
        self._counters = counters
        self._local = _address(getattr(scope, "server", "") or "") if sys.platform == "linux" else None
        self._remote = _address(getattr(scope, "client", "") or "")
        self._base: int | None = None
        self._inode = 0
        self.handed = 0  # bytes handed to granian since `begin`, framing included
        self._check_at = 0  # `handed` at which the reader may first be over the window
        self._over = False  # the last measure found the reader over the bound
        self._over_since: float | None = None  # when the reader last went over it
        # The last measure: when it was taken and what the kernel had taken then, for the
        # rate a parked writer sleeps by.
        self._measured_at = 0.0
        self._taken_then = 0
        self._rate = 0.0  # bytes/s the kernel took between the last two measures
        self.measures = 0  # how often the kernel was asked (the bench's and tests' figure)
        # `drained`'s level, and the least credit a measure must find for the writer to go
        # on: a reader that hovers just under the bound is not asked about on every write.
        self._every = max(1, min(64 * 1024, limit // 4))

    def begin(self) -> None:
        """Call before the response starts: what the kernel took so far is not this stream's."""
        if self._local is not None and self._remote is not None and self._local[0] in ("0.0.0.0", "::"):
            # Listening on every address: the connection's own is the one its client reached,
            # which the kernel knows (the client's own address is not it unless on one host).
            self._local = self._counters.local_of(self._local[1], self._remote)
        self._base = self._taken()
        self._measured_at, self._taken_then = time.monotonic(), self._base or 0
        self._check_at = self.window

    def narrow(self, window: int) -> None:
        """Bounds this reader at `window` from now on (at most the configured limit): a log
        that is complete races no generation, so its reader needs only enough in flight to
        keep its connection busy."""
        if window < self.window:
            self.window = window
            self._every = max(1, min(self._every, window // 4))
            self._check_at = min(self._check_at, self.handed + window)

    @property
    def measured(self) -> bool:
        return self._base is not None

    def _taken(self) -> int | None:
        if self._local is None or self._remote is None:
            return None
        self.measures += 1
        found = self._counters.query(self._local, self._remote)
        if found is None:
            return None
        self._inode = found[1]
        return found[0]

    def sent(self, size: int) -> None:
        self.handed += size + _chunk_framing(size)

    def behind(self) -> int | None:
        """Bytes granian holds for this reader now; None when unknown (e.g. it closed)."""
        if self._base is None:
            return None
        taken = self._taken()
        if taken is None:
            return None
        now = time.monotonic()
        if now > self._measured_at:
            self._rate = (taken - self._taken_then) / (now - self._measured_at)
        self._measured_at, self._taken_then = now, taken
        behind = max(0, self.handed - (taken - self._base))
        self._check_at = self.handed + self.window - behind
        return behind

    def over(self) -> bool:
        """Whether the reader is over the bound, or within `_every` of it: measured again
        once enough was handed over since the last measure to get there, else what that one
        found."""
        if self._base is not None and self.handed >= self._check_at:
            behind = self.behind()
            self._over = behind is not None and behind + self._every > self.window
        return self._over

    async def room(self, hurry: Callable[[], bool] | None = None) -> bool:
        """Returns when the reader is within the bound; waits (measuring with backoff) while it
        is over, until it is back under half; ReaderStalled past the write deadline, counted
        from when the reader first went over. `hurry`: returns at once when it says so (the
        writer is about to lose events it has not sent), the deadline still running: False
        then, True otherwise."""
        if self.over():
            if not await self._wait_under(self.window // 2, hurry):
                return False
            self._over = False
            self._over_since = None
        return True

    async def drained(self) -> None:
        """Returns once granian holds at most one measure's worth for this reader (the stream
        slot is held until then); ReaderStalled past the write deadline."""
        if self._base is None or self.handed == 0:
            return
        behind = self.behind()
        if behind is None or behind <= self._every:
            return
        await self._wait_under(self._every)
        self._over_since = None

    async def _wait_under(self, level: int, hurry: Callable[[], bool] | None = None) -> bool:
        """True once the reader is under `level` (or gone); False when `hurry` said so first."""
        if self._over_since is None:
            self._over_since = time.monotonic()
        deadline = self._over_since + self.write_timeout
        # At most every 0.5 s; with `hurry`, every 5 ms (a fast generation fills a ring in well
        # under a second).
        slowest = 0.5 if hurry is None else 0.005
        delay = self._pace(level, slowest)
        while True:
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            behind = self.behind()
            if behind is None or behind <= level:
                return True
            if time.monotonic() >= deadline:
                raise ReaderStalled(f"{behind} bytes not taken within {self.write_timeout:g} s")
            if hurry is not None and hurry():
                return False
            # A reader that is taking bytes is asked again when, at the pace it took them
            # between the last two measures, it will be under `level`: 5 queries a wait where
            # a backoff from 1 ms asked 19 (tests/unit/http/test_outflow.py). One that takes
            # nothing backs off. Never longer than `slowest`: a writer that slept 0.5 s behind
            # a fast reader let a fast generation run a whole ring past it (event_history_expired).
            delay = self._pace(level, slowest, delay * 2)

    def _pace(self, level: int, slowest: float, otherwise: float = 0.001) -> float:
        """How long to sleep before asking again whether the reader is under `level`: as long
        as it takes at the rate of the last two measures, else `otherwise`; 1 ms to `slowest`."""
        behind = self.handed - (self._taken_then - (self._base or 0))
        wait = (behind - level) / self._rate if self._rate > 0 else otherwise
        return min(max(0.001, wait), slowest)

    def close(self) -> bool:
        """Shuts the connection down: granian then drops what it holds for it. The socket is
        found by its inode among this process's descriptors, and checked once opened. False
        when it was not found."""
        inode = self._inode
        if not inode:
            return False
        try:
            names = os.listdir("/proc/self/fd")
        except OSError:
            return False
        target = f"socket:[{inode}]"
        for name in names:
            try:
                if os.readlink(f"/proc/self/fd/{name}") != target:
                    continue
                fd = os.dup(int(name))
            except OSError:
                continue
            try:
                if os.fstat(fd).st_ino == inode:  # not a descriptor reused since readlink
                    sock = socket.socket(fileno=fd)
                    try:
                        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                            return False  # never the listener, whatever the inode said
                        # Reset, not a FIN queued behind the bytes the reader never took: when
                        # granian closes the connection on its failed write, the kernel drops them.
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    finally:
                        sock.close()  # our duplicate only; granian's descriptor stays its own
                    return True
            except OSError:
                pass
            os.close(fd)
        return False
