"""Which sibling a replica sends a request to (http/forward.py `Forwarder.target`), from the
residency it read at its last beat: one that has the model loaded and is not busy; nobody for
a model loaded here, a model this replica does not serve, or only busy holders (counted as a
fallback, by reason); and what a forward sends and passes back, against a plain HTTP server
standing in for the sibling. Through real replicas: tests/e2e/test_routing.py."""

from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import ClassVar

from lmsp.events.residency import Board, InProcessResidency, Residence
from lmsp.http.forward import Forwarder, model_of
from lmsp.http.request import Request
from lmsp.observability.metrics import Metrics

SERVED = ["smol:a", "smol:b", "smol:c"]


def _forwarder(board: Board, loaded: list[str], metrics: Metrics) -> Forwarder:
    return Forwarder(
        InProcessResidency(board),
        "http://127.0.0.1:1",
        models=lambda: loaded,
        known=lambda model: model in SERVED,
        busy=lambda: False,
        metrics=metrics,
    )


def test_only_a_live_not_busy_holder_of_a_model_not_loaded_here_is_a_target() -> None:
    async def main() -> None:
        board, metrics = Board(), Metrics()
        here = _forwarder(board, ["smol:a"], metrics)
        await InProcessResidency(board).announce(Residence("idle", "http://10.0.0.2:8750", ("smol:a", "smol:b")))
        await InProcessResidency(board).announce(Residence("full", "http://10.0.0.3:8750", ("smol:c",), busy=True))
        await here.beat()
        target = here.target("smol:b")
        assert target is not None and target.replica == "idle"
        assert here.target("smol:a") is None  # loaded here: served here
        assert here.target("smol:z") is None  # not served by this replica: its 404 is local
        assert here.target("smol:c") is None  # its only holder is busy
        assert metrics.forward_fallbacks.labels("busy")._value.get() == 1
        # Its own entry is never a target, whatever it holds.
        assert all(e.replica != here.replica for e in here._view)
        await here.aclose()
        assert here.replica not in board.entries  # withdrawn at once

    asyncio.run(main())


def test_a_view_that_cannot_be_refreshed_routes_nothing() -> None:
    class Broken(InProcessResidency):
        async def entries(self) -> list[Residence]:
            raise ConnectionError("redis is away")

    async def main() -> None:
        board = Board()
        here = _forwarder(board, [], Metrics())
        await InProcessResidency(board).announce(Residence("idle", "http://10.0.0.2:8750", ("smol:b",)))
        await here.beat()
        assert here.target("smol:b") is not None
        here._residency = Broken(board)
        await here.beat()
        assert here.target("smol:b") is None
        await here.aclose()

    asyncio.run(main())


def test_the_model_is_read_from_any_faces_body() -> None:
    assert model_of(b'{"model": "smol:a", "input": "hi"}') == "smol:a"
    assert model_of(b'{"model": 3}') is None
    assert model_of(b"[1]") is None
    assert model_of(b"{not json") is None


class _Sibling(BaseHTTPRequestHandler):
    """A sibling replica as far as a forward sees it: answers `status`, recording what came."""

    status = 200
    seen: ClassVar[list[tuple[str, dict[str, str], bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        type(self).seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(self.status)
        self.send_header("content-type", "text/event-stream")
        self.send_header("lmsp-served-by", "sibling")
        self.end_headers()
        self.wfile.write(b"id: 1\nevent: response.created\ndata: {}\n\n")

    def log_message(self, *args: object) -> None:
        pass


class _Recorder:
    """granian's protocol object, as far as a forwarded answer is written on it."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.body = b""

    def response_stream(self, status: int, headers: list[tuple[str, str]]) -> _Recorder:
        self.status, self.headers = status, headers
        return self

    async def send_bytes(self, data: bytes) -> None:
        self.body += data

    async def client_disconnect(self) -> None:
        await asyncio.Event().wait()  # this client never leaves


def _request(proto: _Recorder) -> Request:
    headers = {
        "authorization": "Bearer secret",
        "content-type": "application/json",
        "host": "balancer.example:443",
    }
    scope = SimpleNamespace(method="POST", path="/lmsp/v1/responses", query_string="", headers=headers)
    return Request(scope, proto, {})


class _Body:
    """The request body as granian hands it over: one chunk, then the empty end."""

    def __init__(self, body: bytes) -> None:
        self.chunks = [body, b""]

    def __aiter__(self) -> _Body:
        return self

    async def __anext__(self) -> bytes:
        if not self.chunks:
            raise StopAsyncIteration
        return self.chunks.pop(0)


class _Proto(_Recorder, _Body):
    def __init__(self, body: bytes) -> None:
        _Recorder.__init__(self)
        _Body.__init__(self, body)


BODY = b'{"model": "smol:b", "input": "hi", "stream": true}'


def _forward_to(port: int, status: int) -> tuple[bool, _Proto, Metrics, Request]:
    _Sibling.status = status

    async def main() -> tuple[bool, _Proto, Metrics, Request]:
        board, metrics = Board(), Metrics()
        here = _forwarder(board, [], metrics)
        await InProcessResidency(board).announce(Residence("sib", f"http://127.0.0.1:{port}", ("smol:b",)))
        await here.beat()
        proto = _Proto(BODY)
        req = _request(proto)
        try:
            served = await here.route(req, proto, 1 << 20)
        finally:
            await here.aclose()
        return served, proto, metrics, req

    return asyncio.run(main())


def test_a_forward_passes_the_request_on_marked_and_the_answer_back() -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Sibling) as sibling:
        threading.Thread(target=sibling.serve_forever, daemon=True).start()
        _Sibling.seen.clear()
        served, proto, metrics, _ = _forward_to(sibling.server_address[1], 200)
        sibling.shutdown()
    assert served and proto.status == 200
    assert ("lmsp-served-by", "sibling") in proto.headers
    assert proto.body == b"id: 1\nevent: response.created\ndata: {}\n\n"
    path, headers, body = _Sibling.seen[0]
    assert (path, body) == ("/lmsp/v1/responses", BODY)
    assert headers["authorization"] == "Bearer secret" and headers["host"] == "balancer.example:443"
    assert headers["lmsp-forwarded"]  # the forwarding replica's id: never sent on again
    assert metrics.forwarded.labels("model")._value.get() == 1


def test_a_sibling_that_refuses_leaves_the_request_to_be_served_here() -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Sibling) as sibling:
        threading.Thread(target=sibling.serve_forever, daemon=True).start()
        served, proto, metrics, req = _forward_to(sibling.server_address[1], 503)
        sibling.shutdown()
    assert not served and proto.status is None  # nothing written: the face answers
    assert req.prefetched == BODY  # the body, read once, is the face's
    assert metrics.forward_fallbacks.labels("refused")._value.get() == 1
    assert metrics.forwarded.labels("model")._value.get() == 0


def test_a_sibling_gone_leaves_the_request_to_be_served_here() -> None:
    with socket.socket() as probe:  # a port nobody listens on any more
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served, proto, metrics, _ = _forward_to(port, 200)
    assert not served and proto.status is None
    assert metrics.forward_fallbacks.labels("unreachable")._value.get() == 1
