"""The nginx balancer the replica tests put in front of their replicas (lmsp/testing_servers.py),
over two plain HTTP backends: round-robin, a 503 retried on the sibling (POSTs included), and a
reload that changes the list while a slow answer on the old list still completes."""

from __future__ import annotations

import http.server
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from lmsp.testing_servers import NginxBalancer, missing_nginx, nginx_balancer


class _Backend(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(1.5)
        body = f"{self.server.server_port} {self.headers['Host']}".encode()
        self.send_response(503 if self.server.draining else 200)
        self.send_header("content-length", str(len(body)))
        if self.server.draining:
            self.send_header("retry-after", "1")
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, format: str, *args: object) -> None:
        pass


class _Server(http.server.ThreadingHTTPServer):
    draining = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_port}"


@pytest.fixture
def backends() -> Iterator[list[_Server]]:
    servers = [_Server(("127.0.0.1", 0), _Backend) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    yield servers
    for s in servers:
        s.shutdown()
        s.server_close()


@pytest.fixture
def balancer(backends: list[_Server]) -> Iterator[NginxBalancer]:
    why = missing_nginx()
    if why is not None:
        pytest.skip(why)
    with nginx_balancer([s.url for s in backends]) as b:
        yield b


def _get(url: str, data: bytes | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=30) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_round_robin_with_the_clients_host(balancer: NginxBalancer, backends: list[_Server]) -> None:
    answers = [_get(balancer.url + "/x") for _ in range(4)]
    assert {status for status, _ in answers} == {200}
    assert {body.split()[0] for _, body in answers} == {str(s.server_port) for s in backends}
    # The replica sees the name the client used, so lmsp's loopback Host rule accepts it.
    assert {body.split()[1] for _, body in answers} == {f"127.0.0.1:{balancer.port}"}


def test_a_503_is_retried_on_the_sibling_posts_included(balancer: NginxBalancer, backends: list[_Server]) -> None:
    backends[0].draining = True
    for data in (None, b"{}"):
        answers = [_get(balancer.url + "/x", data) for _ in range(4)]
        assert answers == [(200, f"{backends[1].server_port} 127.0.0.1:{balancer.port}")] * 4
    backends[1].draining = True  # none left: the client gets the 503
    assert _get(balancer.url + "/x")[0] == 503


def test_reload_changes_the_list_and_keeps_a_running_answer(balancer: NginxBalancer, backends: list[_Server]) -> None:
    slow: list[tuple[int, str]] = []
    # Two slow answers, one on each backend (round-robin), running across the reload.
    readers = [threading.Thread(target=lambda: slow.append(_get(balancer.url + "/slow"))) for _ in range(2)]
    for t in readers:
        t.start()
    time.sleep(0.3)
    balancer.set_upstreams([backends[1].url])
    answers = [_get(balancer.url + "/x") for _ in range(4)]
    assert {body.split()[0] for _, body in answers} == {str(backends[1].server_port)}
    for t in readers:
        t.join()
    assert sorted(body.split()[0] for _, body in slow) == sorted(str(s.server_port) for s in backends)
