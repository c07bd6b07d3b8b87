"""The drain measure on real loopback sockets (no server): what the kernel took from a
connection, how far behind its reader is, and the reset of one that never reads."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import pytest

from lmsp.http.outflow import Outflow, ReaderStalled, TcpCounters

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="sock_diag is Linux's")


def _pair(receive_buffer: int | None = 4096) -> tuple[socket.socket, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    reader = socket.socket()
    if receive_buffer is not None:
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    reader.connect(listener.getsockname())
    writer, _ = listener.accept()
    listener.close()
    return writer, reader


def _scope(writer: socket.socket) -> SimpleNamespace:
    local, remote = writer.getsockname(), writer.getpeername()
    return SimpleNamespace(server=f"{local[0]}:{local[1]}", client=f"{remote[0]}:{remote[1]}")


def test_the_kernel_counts_what_it_took():
    writer, reader = _pair()
    with writer, reader:
        counters = TcpCounters()
        local, remote = writer.getsockname(), writer.getpeername()
        before = counters.query(local, remote)
        assert before is not None and before[0] == 0
        writer.sendall(b"x" * 50_000)
        taken, inode = counters.query(local, remote) or (None, None)
        assert taken == 50_000
        assert inode == os.fstat(writer.fileno()).st_ino
        assert counters.query(local, ("127.0.0.1", 1)) is None  # no such connection
        counters.close()


def test_a_reader_that_never_reads_is_behind_then_reset():
    writer, reader = _pair()
    writer.setblocking(False)
    with writer, reader:
        counters = TcpCounters()
        outflow = Outflow(_scope(writer), limit=64 * 1024, write_timeout=0.3, counters=counters)
        outflow.begin()
        assert outflow.measured
        # What the app "handed" and the kernel would not take: counted, not sent.
        outflow.sent(10 * 1024 * 1024)
        assert outflow.over()
        started = time.monotonic()
        with pytest.raises(ReaderStalled):
            asyncio.run(outflow.room())
        assert 0.3 <= time.monotonic() - started < 2
        assert outflow.close()
        counters.close()
        # Shut down both ways: the reader sees the end (in the service, a reset: granian closes
        # its descriptor on the failed write, with SO_LINGER 0 set).
        reader.settimeout(2)
        assert reader.recv(65536) == b""


def test_a_gone_connection_is_not_answered_by_the_listener():
    # The kernel's lookup of an address pair falls back to the listening socket on that port:
    # taken for the connection, its reset would stop the service from accepting (it did).
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    with listener:
        counters = TcpCounters()
        host, port = listener.getsockname()
        assert counters.query((host, port), ("127.0.0.1", 1)) is None
        outflow = Outflow(
            SimpleNamespace(server=f"{host}:{port}", client="127.0.0.1:1"),
            limit=1024,
            write_timeout=0.1,
            counters=counters,
        )
        outflow.begin()
        assert not outflow.close()
        counters.close()
        assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)


def _request(local: tuple[str, int], remote: tuple[str, int], seq: int) -> bytes:
    """A sock_diag request for one connection, as TcpCounters sends it, with its own `seq`."""
    sockid = struct.pack("!HH", local[1], remote[1]) + socket.inet_aton(local[0]).ljust(16, b"\0")
    sockid += socket.inet_aton(remote[0]).ljust(16, b"\0") + struct.pack("=III", 0, 0xFFFFFFFF, 0xFFFFFFFF)
    request = struct.pack("=BBBBI", socket.AF_INET, socket.IPPROTO_TCP, 2, 0, 0xFFF) + sockid
    return struct.pack("=IHHII", 16 + len(request), 20, 1, seq, 0) + request


def test_a_lost_reply_is_not_taken_for_a_later_answer():
    # One reply left unread (its receive failed) used to answer the next query, and that one's
    # the query after: every answer one behind, each for another connection or an older count.
    (writer_a, reader_a), (writer_b, reader_b) = _pair(), _pair()
    with writer_a, reader_a, writer_b, reader_b:
        a = writer_a.getsockname(), writer_a.getpeername()
        b = writer_b.getsockname(), writer_b.getpeername()
        writer_b.sendall(b"x" * 1000)
        counters = TcpCounters()
        assert counters.query(*a) == (0, os.fstat(writer_a.fileno()).st_ino)
        # A request whose reply nobody read: it is on the netlink socket when the next comes.
        netlink = socket.socket(fileno=os.dup(counters._sock.fileno()))  # type: ignore[union-attr]
        with netlink:
            netlink.send(_request(*a, seq=0x7FFF0000))
        assert counters.query(*b) == (1000, os.fstat(writer_b.fileno()).st_ino)
        writer_a.sendall(b"y" * 300)
        assert counters.query(*a) == (300, os.fstat(writer_a.fileno()).st_ino)
        counters.close()


def _global_address() -> str | None:
    """One of this machine's addresses that is not loopback, if it has one."""
    found = subprocess.run(["ip", "-o", "-4", "addr", "show", "scope", "global"], capture_output=True, text=True)
    for line in found.stdout.splitlines():
        return line.split()[3].partition("/")[0]
    return None


def test_a_wildcard_listener_measures_a_client_on_another_address():
    # Served on 0.0.0.0, granian names the listener's address; the connection's own is the one
    # its client reached. A loopback client that reached the machine's other address used to
    # go unmeasured: the service looked the connection up by the client's address instead.
    address = _global_address()
    if address is None:
        pytest.skip("this machine has no address but loopback")
    listener = socket.socket()
    listener.bind(("0.0.0.0", 0))
    listener.listen()
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.bind(("127.0.0.1", 0))
    reader.connect((address, listener.getsockname()[1]))
    writer, _ = listener.accept()
    listener.close()
    with writer, reader:
        assert writer.getsockname()[0] == address
        peer = writer.getpeername()
        counters = TcpCounters()
        scope = SimpleNamespace(server=f"0.0.0.0:{writer.getsockname()[1]}", client=f"{peer[0]}:{peer[1]}")
        outflow = Outflow(scope, limit=64 * 1024, write_timeout=0.3, counters=counters)
        outflow.begin()
        assert outflow.measured
        outflow.sent(10 * 1024 * 1024)
        assert outflow.over()
        assert outflow.close()
        counters.close()


class _Counting(TcpCounters):
    def __init__(self) -> None:
        super().__init__()
        self.asked = 0

    def query(self, local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
        self.asked += 1
        return super().query(local, remote)


def test_a_reader_that_keeps_up_is_asked_about_once_a_window():
    # The reader cannot pass the bound before a window's worth more is written than what the
    # last measure found behind: asking sooner only costs (it cost 0.83-0.89x the events/s).
    writer, reader = _pair()
    with writer, reader:
        counters = _Counting()
        window = 1024 * 1024
        outflow = Outflow(_scope(writer), limit=window, write_timeout=1, counters=counters)
        outflow.begin()
        begun = counters.asked
        chunk = b"z" * 1000
        for _ in range(4 * 1024):  # 4 MB, read as it is written
            writer.sendall(chunk)
            outflow.sent(len(chunk))
            assert not outflow.over()
            reader.recv(len(chunk), socket.MSG_WAITALL)
        asked = counters.asked - begun
        assert 3 <= asked <= 5, asked  # once per window written (4 MB), not once per 64 KiB (64 times)
        counters.close()


def test_a_parked_writer_is_asked_about_by_its_readers_pace():
    # A writer over the bound used to ask the kernel every millisecond while its reader drained
    # (64 parked streams: 64 queries a millisecond, each waiting for the socket's lock while
    # granian wrote, the event loop blocked; issue 53). It now sleeps for as long as the reader,
    # at the pace it took bytes, needs to come back under the level.
    # Small kernel buffers on both ends: what they hold is taken, so "granian" holds the rest.
    writer, reader = _pair(receive_buffer=64 * 1024)
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    window = 256 * 1024
    handed = 4 * window  # what "granian" holds and writes as the kernel takes it
    taken = threading.Event()

    def granian() -> None:
        writer.sendall(b"g" * handed)

    def read_at_a_steady_pace() -> None:
        got = 0
        while got < handed:  # ~2 MB/s: 32 KiB every 16 ms
            chunk = reader.recv(32 * 1024)
            if not chunk:
                return
            got += len(chunk)
            time.sleep(0.016)
        taken.set()

    with writer, reader:
        counters = _Counting()
        outflow = Outflow(_scope(writer), limit=window, write_timeout=20, counters=counters)
        outflow.begin()
        threads = [threading.Thread(target=granian), threading.Thread(target=read_at_a_steady_pace)]
        outflow.sent(handed)
        for t in threads:
            t.start()
        begun = counters.asked
        started = time.monotonic()
        assert asyncio.run(outflow.room())  # over (~1 MiB held), then back under half the window
        waited = time.monotonic() - started
        asked = counters.asked - begun
        for t in threads:
            t.join(30)
        assert taken.is_set()
        # Draining ~0.65 MiB at ~2 MB/s takes ~0.35 s: the backoff that started at 1 ms and
        # halved on every progress asked 19 times here, the pace 5.
        assert waited > 0.2, waited
        assert asked <= 9, (asked, waited)
        counters.close()
