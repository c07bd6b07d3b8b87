"""An SSE response read over a raw asyncio socket, as light as a client can be: a thousand of
them share the machine with the server they measure, so each read costs one `count` of frame
ends and one clock reading, and nothing is parsed."""

from __future__ import annotations

import asyncio
import time

import orjson

__all__ = ["SseStream", "gaps_us"]

_END = b"\r\n0\r\n\r\n"  # the last chunk of a chunked body (no frame can end this way)


class SseStream:
    """One request whose answer is an event stream. `opened` is set once the answer's head
    arrived (the server holds the stream); `arrivals` has, for each read that brought frames,
    when it came and how many it brought."""

    def __init__(self, port: int, method: str, path: str, body: dict[str, object] | None = None) -> None:
        self.port = port
        data = orjson.dumps(body) if body is not None else b""
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        self.request = head.encode() + b"\r\n" + data
        self.opened = asyncio.Event()
        self.events = 0
        self.arrivals: list[tuple[float, int]] = []

    async def run(self) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(self.request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise AssertionError(
                    f"{self.request.split(b' ', 2)[1].decode()}: {(head + await reader.read(2048)).decode()}"
                )
            self.opened.set()
            last = b""
            while chunk := await reader.read(262144):
                joined = last + chunk
                # Every frame ends with a blank line, and nothing else holds one (compact JSON).
                if n := joined.count(b"\n\n") - last.count(b"\n\n"):
                    self.arrivals.append((time.perf_counter(), n))
                    self.events += n
                last = joined[-len(_END) :]
                if last == _END:
                    break
        finally:
            writer.close()


def gaps_us(streams: list[SseStream]) -> list[float]:
    """Microseconds a client waited for its next events: between each two reads of one stream
    that brought some. (Events that came in one read were written together; a gap of 0 for
    each would drown the waits that matter.)"""
    return [(b - a) * 1e6 for s in streams for (a, _), (b, _) in zip(s.arrivals, s.arrivals[1:], strict=False)]
