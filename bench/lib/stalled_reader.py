"""The stalled reader of issue 53, shared by bench_backpressure.py and
bench/scripts/backpressure_probe.py: one long scripted stream, read at full speed or 1 byte a
second, beside the streams being measured.

The long stream is the scripted model's, paced (`!slow`): a 4 KiB delta every 8 ms, the same
generation whatever its reader does. A real model's few KB/s would not get its reader past the
bound in a round: the kernel's send buffer for the connection grows first (up to tcp_wmem's
4 MiB), and counts as taken. At ~0.5 MB/s the stalled reader is past the default 1 MiB bound
~8 s in (with a 2 s write deadline, its connection was closed 9.8 s in). Faster, the fast
reader's own cost (a Python client reading 4 MB/s) slowed the streams beside it by a quarter."""

from __future__ import annotations

import socket
import threading
from typing import Any

import orjson

__all__ = ["LONG_EVENTS", "LONG_TEXT", "long_reader", "responses_body"]

LONG_TEXT = "!slow 8 !repeat " + "x" * 4096
LONG_EVENTS = 30_000  # 4 minutes of them: longer than any round


def responses_body(model: str, text: str, tokens: int) -> dict[str, Any]:
    """A streamed `POST /lmsp/v1/responses` body: one user message, greedy."""
    content = [{"type": "input_text", "text": text}]
    return {
        "model": model,
        "input": [{"type": "message", "role": "user", "content": content}],
        "max_output_tokens": tokens,
        "temperature": 0,
        "stream": True,
    }


def long_reader(port: int, body: dict[str, Any], fast: bool, stop: threading.Event) -> None:
    """One long stream: read as it comes, or one byte a second from a 4 KiB receive buffer,
    until `stop`."""
    data = orjson.dumps(body)
    with socket.socket() as sock:
        if not fast:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        head = (
            "POST /lmsp/v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        sock.sendall(head.encode() + data)
        while not stop.is_set():
            if not sock.recv(65536 if fast else 1):
                return
            if not fast:
                stop.wait(1.0)
