"""The drain measure on real loopback sockets (no server): what the kernel took from a
connection, how far behind its reader is, and the reset of one that never reads."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from types import SimpleNamespace

import pytest

from lmsp.http.outflow import Outflow, ReaderStalled, TcpCounters

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="sock_diag is Linux's")


def _pair() -> tuple[socket.socket, socket.socket]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
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
