"""Which sibling a replica sends a request to (http/forward.py `Forwarder.target`), from the
residency it read at its last beat: one that has the model loaded and is not busy; nobody for
a model loaded here, a model this replica does not serve, or only busy holders (counted as a
fallback, by reason); for a model loaded here, the sibling that served the conversation last
when this replica did not; and what a forward sends and passes back, against a plain HTTP
server standing in for the sibling. Through real replicas: tests/e2e/test_routing.py and
tests/e2e/test_routing_affinity.py."""

from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import ClassVar

from lmsp.events.residency import MAX_KEYS, Board, InProcessResidency, Residence
from lmsp.http.affinity import affinity_key, response_key
from lmsp.http.forward import Forwarder, json_object
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
        assert target is not None and target[0].replica == "idle" and target[1] == "model"
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


def test_any_faces_body_is_read_as_a_json_object() -> None:
    assert json_object(b'{"model": "smol:a", "input": "hi"}') == {"model": "smol:a", "input": "hi"}
    assert json_object(b"[1]") == {}
    assert json_object(b"{not json") == {}


KEY, OTHER = "a" * 32, "b" * 32


def test_a_conversation_a_sibling_served_last_and_this_replica_did_not_is_sent_there() -> None:
    async def main() -> None:
        board, metrics = Board(), Metrics()
        here = _forwarder(board, ["smol:a"], metrics)
        await InProcessResidency(board).announce(Residence("warm", "http://10.0.0.2:8750", ("smol:a",), keys=(KEY,)))
        await InProcessResidency(board).announce(Residence("cold", "http://10.0.0.3:8750", ("smol:a",)))
        await InProcessResidency(board).announce(Residence("full", "http://10.0.0.4:8750", ("smol:a",), True, (OTHER,)))
        await InProcessResidency(board).announce(Residence("other", "http://10.0.0.5:8750", ("smol:b",), keys=(OTHER,)))
        await here.beat()
        target = here.target("smol:a", KEY)
        assert target is not None and target[0].replica == "warm" and target[1] == "affinity"
        assert here.target("smol:a") is None  # no conversation: the model is loaded here
        assert here.target("smol:a", "c" * 32) is None  # nobody served it: here is as good
        # Its only holder with the model is busy (counted); the one without the model is no holder.
        assert here.target("smol:a", OTHER) is None
        assert metrics.forward_fallbacks.labels("busy")._value.get() == 1
        here.served(KEY)
        assert here.target("smol:a", KEY) is None  # served here too: here is as good
        await here.aclose()

    asyncio.run(main())


def test_of_the_siblings_with_a_model_not_loaded_here_the_one_that_served_the_conversation_is_chosen() -> None:
    async def main() -> None:
        board = Board()
        here = _forwarder(board, [], Metrics())
        for i in range(8):
            await InProcessResidency(board).announce(Residence(f"cold{i}", f"http://10.0.0.{i}:8750", ("smol:b",)))
        await InProcessResidency(board).announce(Residence("warm", "http://10.0.1.1:8750", ("smol:b",), keys=(KEY,)))
        await here.beat()
        target = here.target("smol:b", KEY)
        assert target is not None and target[0].replica == "warm" and target[1] == "model"
        await here.aclose()

    asyncio.run(main())


def test_the_conversations_served_here_are_published_the_latest_few() -> None:
    here = _forwarder(Board(), [], Metrics())
    for i in range(MAX_KEYS + 1):
        here.served(f"{i:032x}")
    here.served(f"{1:032x}")  # served again: the latest
    here.produced("token:alice", "resp_1")
    keys = here.mine().keys
    assert len(keys) == MAX_KEYS
    assert keys[-2:] == (f"{1:032x}", response_key("token:alice", "resp_1"))
    assert f"{0:032x}" not in keys and f"{2:032x}" not in keys  # the oldest went
    assert Residence.decode(here.mine().encode()) == here.mine()  # an entry at its bound is read


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


def _forward_to(
    port: int, status: int, body: bytes = BODY, loaded: tuple[str, ...] = (), keys: tuple[str, ...] = ()
) -> tuple[bool, _Proto, Metrics, Request, Forwarder]:
    """`body` sent to a replica with `loaded`, whose one sibling (at `port`) has smol:b loaded
    and served the conversations `keys`."""
    _Sibling.status = status

    async def main() -> tuple[bool, _Proto, Metrics, Request, Forwarder]:
        board, metrics = Board(), Metrics()
        here = _forwarder(board, list(loaded), metrics)
        await InProcessResidency(board).announce(Residence("sib", f"http://127.0.0.1:{port}", ("smol:b",), keys=keys))
        await here.beat()
        proto = _Proto(body)
        req = _request(proto)
        try:
            served = await here.route(req, proto, 1 << 20)
        finally:
            await here.aclose()
        return served, proto, metrics, req, here

    return asyncio.run(main())


def test_a_forward_passes_the_request_on_marked_and_the_answer_back() -> None:
    with ThreadingHTTPServer(("127.0.0.1", 0), _Sibling) as sibling:
        threading.Thread(target=sibling.serve_forever, daemon=True).start()
        _Sibling.seen.clear()
        served, proto, metrics, *_ = _forward_to(sibling.server_address[1], 200)
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
        served, proto, metrics, req, _ = _forward_to(sibling.server_address[1], 503)
        sibling.shutdown()
    assert not served and proto.status is None  # nothing written: the face answers
    assert req.prefetched == BODY  # the body, read once, is the face's
    assert metrics.forward_fallbacks.labels("refused")._value.get() == 1
    assert metrics.forwarded.labels("model")._value.get() == 0


def test_a_sibling_gone_leaves_the_request_to_be_served_here() -> None:
    with socket.socket() as probe:  # a port nobody listens on any more
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served, proto, metrics, *_ = _forward_to(port, 200)
    assert not served and proto.status is None
    assert metrics.forward_fallbacks.labels("unreachable")._value.get() == 1


CHAT = b'{"model": "smol:b", "messages": [{"role": "user", "content": "hi"}]}'
CHAT_KEY = affinity_key(json_object(CHAT), "local")


def test_a_conversation_the_sibling_served_is_forwarded_for_affinity() -> None:
    assert CHAT_KEY is not None
    with ThreadingHTTPServer(("127.0.0.1", 0), _Sibling) as sibling:
        threading.Thread(target=sibling.serve_forever, daemon=True).start()
        _Sibling.seen.clear()
        served, _, metrics, _, here = _forward_to(sibling.server_address[1], 200, CHAT, ("smol:b",), (CHAT_KEY,))
        sibling.shutdown()
    assert served and _Sibling.seen[0][2] == CHAT
    assert metrics.forwarded.labels("affinity")._value.get() == 1
    assert CHAT_KEY not in here.mine().keys  # served there, not here


def test_a_conversation_served_here_is_noted_as_served_here() -> None:
    with socket.socket() as probe:  # the sibling that served it is gone
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    served, _, metrics, _, here = _forward_to(port, 200, CHAT, ("smol:b",), (CHAT_KEY,))
    assert not served and metrics.forward_fallbacks.labels("unreachable")._value.get() == 1
    assert here.mine().keys == (CHAT_KEY,)
