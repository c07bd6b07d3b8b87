"""A TCP proxy on 127.0.0.1 in front of a real server that breaks connections on purpose, for
the client's resume and retry tests. `plan(n)` says what happens to the n-th connection."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Cut:
    """Forward `after` bytes of the server's answer, then close both sides."""

    after: int


class DropAfterRequest:
    """Forward the request, then hang up on the client before a byte of the answer reaches it;
    the server's side stays open, and what it answers is kept in `Proxy.answers`."""


Plan = Callable[[int], "Cut | DropAfterRequest | None"]


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def _request_length(head: bytes) -> int:
    """Bytes in a request whose head (up to the blank line) is `head`: the head and its body."""
    end = head.index(b"\r\n\r\n") + 4
    length = 0
    for line in head[:end].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return end + length


class Proxy:
    def __init__(self, upstream_port: int, plan: Plan) -> None:
        self.upstream_port = upstream_port
        self.plan = plan
        self.connections = 0
        self.cuts = 0
        self.answers: list[bytearray] = []  # what the server sent on each connection
        self._changed = threading.Condition()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: set[socket.socket] = set()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        _close(self._listener)
        self.hang_up()

    def hang_up(self) -> None:
        """Closes every connection open now, both sides, as a network that drops would."""
        for sock in list(self._open):
            _close(sock)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def wait_answer(self, n: int, marker: bytes, timeout: float = 30) -> bytes:
        """What the server sent on connection `n`, once it holds `marker`."""
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.answers) > n and marker in self.answers[n], timeout), bytes(
                self.answers[n]
            )
            return bytes(self.answers[n])

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:  # the server is down (a restart): the client's connection drops
                _close(client)
                continue
            self._open |= {client, upstream}
            with self._changed:
                n = self.connections
                self.connections += 1
                self.answers.append(bytearray())
            action = self.plan(n)
            threading.Thread(target=self._requests, args=(client, upstream, action), daemon=True).start()
            threading.Thread(target=self._answers, args=(n, client, upstream, action), daemon=True).start()

    def _requests(self, client: socket.socket, upstream: socket.socket, action: Cut | DropAfterRequest | None) -> None:
        sent = b""
        try:
            while chunk := client.recv(65536):
                upstream.sendall(chunk)
                if isinstance(action, DropAfterRequest):
                    sent += chunk
                    if b"\r\n\r\n" in sent and len(sent) >= _request_length(sent):
                        _close(client)
                        return
        except OSError:
            pass
        _close(upstream)

    def _answers(
        self, n: int, client: socket.socket, upstream: socket.socket, action: Cut | DropAfterRequest | None
    ) -> None:
        left = action.after if isinstance(action, Cut) else None
        try:
            while chunk := upstream.recv(65536):
                with self._changed:
                    self.answers[n] += chunk
                    self._changed.notify_all()
                if isinstance(action, DropAfterRequest):
                    continue
                if left is not None and len(chunk) >= left:
                    client.sendall(chunk[:left])
                    with self._changed:
                        self.cuts += 1
                    break
                client.sendall(chunk)
                if left is not None:
                    left -= len(chunk)
        except OSError:
            pass
        _close(client)
        _close(upstream)
