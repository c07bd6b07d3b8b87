"""A rolling restart of two replicas (real Redis and PostgreSQL) behind nginx round-robin
(lmsp/testing_servers.py), under a steady load of streams and tasks: each replica in turn is
replaced by a new one, added once `/ready`, then SIGTERM'd and drained. No answer fails and no
task event is lost (docs/operations/several-machines.md, "Rolling deploys").

The figures (answers, failures, events lost, 503s sent on, drain times, wall time) are printed
(`pytest -s`); `rolling_restart(folder, drain=0)` is the same restart without a drain."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import pytest

from helpers import SCRIPTED, TASKS, body
from lmsp.client import iter_events
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import (
    missing_nginx,
    missing_servers,
    nginx_balancer,
    postgres_server,
    redis_server,
)

pytestmark = pytest.mark.skipif(
    missing_servers() is not None or missing_nginx() is not None,
    reason=str(missing_servers() or missing_nginx()),
)

STREAMS = 8
TASK_CLIENTS = 8
WORDS = [f"t{i}" for i in range(12)]
PROMPT = "!slow 40 " + " ".join(WORDS)  # 12 tokens, 40 ms apart; the scripted model plays one at a time
ANSWER = " ".join(WORDS)
FINAL = "response.completed"


@dataclass
class Figures:
    answers: int = 0
    failed: list[str] = field(default_factory=list)
    events_lost: int = 0
    tasks: int = 0
    streams: int = 0
    retried_503: int = 0  # requests nginx sent on after a draining replica's 503
    drains_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ok(self, kind: str) -> None:
        with self.lock:
            self.answers += 1
            setattr(self, kind, getattr(self, kind) + 1)

    def fail(self, why: str) -> None:
        with self.lock:
            self.failed.append(why)


def _replica(workdir: Path, redis_url: str, postgres_url: str, drain: float) -> RunningServer:
    workdir.mkdir(parents=True)
    srv = start_server(
        workdir,
        "--store", postgres_url,
        "--events", redis_url,
        "--task-lease", "3",
        "--scripted-model", SCRIPTED,
        "--keepalive", "1",
        "--drain-timeout", str(drain),
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while httpx.get(f"{srv.url}/ready", timeout=10).status_code != 200:  # what a balancer would wait for
        assert time.monotonic() < deadline, "the new replica never became ready"
        time.sleep(0.1)
    return srv


def _text(events: list[tuple[str, bytes]]) -> str:
    return "".join(orjson.loads(d)["delta"] for n, d in events if n == "response.output_text.delta")


def _stream_once(client: httpx.Client, figures: Figures) -> None:
    events: list[tuple[str, bytes]] = []
    try:
        with client.stream("POST", "/lmsp/v1/responses", json=body(PROMPT, model=SCRIPTED, stream=True)) as r:
            if r.status_code != 200:
                figures.fail(f"stream: {r.status_code} {r.read()[:200]!r}")
                return
            events = [(e.event, e.data.encode()) for e in iter_events(r.iter_bytes())]
    except httpx.HTTPError as exc:
        figures.fail(f"stream: {exc!r} after {len(events)} events")
        return
    if not events or events[-1][0] != FINAL or _text(events) != ANSWER:
        figures.fail(f"stream ended {events[-1][0] if events else None}: {_text(events)!r}")
        return
    figures.ok("streams")


def _task_once(client: httpx.Client, figures: Figures) -> None:
    try:
        created = client.post(TASKS, json=body(PROMPT, model=SCRIPTED))
    except httpx.HTTPError as exc:
        figures.fail(f"task: {exc!r}")
        return
    if created.status_code != 202:
        figures.fail(f"task: {created.status_code} {created.text[:200]}")
        return
    task_id = created.json()["id"]
    ids: list[int] = []
    events: list[tuple[str, bytes]] = []
    give_up = time.monotonic() + 60
    # A reader of a task another replica runs is cut when its own replica stops: it resumes
    # after the last id it has, as a client of a resumable stream does.
    while not (events and events[-1][0] in ("response.completed", "response.failed", "response.cancelled", "error")):
        if time.monotonic() > give_up:
            figures.fail(f"task {task_id}: no final event in 60 s ({len(events)} events)")
            return
        headers = {"last-event-id": str(ids[-1])} if ids else {}
        try:
            with client.stream("GET", f"{TASKS}/{task_id}/events", headers=headers) as r:
                if r.status_code != 200:
                    r.read()
                    time.sleep(0.2)
                    continue
                for e in iter_events(r.iter_bytes()):
                    ids.append(int(e.id))
                    events.append((e.event, e.data.encode()))
        except httpx.HTTPError:
            time.sleep(0.2)
    lost = len(set(range(1, ids[-1] + 1)) - set(ids))
    with figures.lock:
        figures.events_lost += lost
    if events[-1][0] != FINAL or _text(events) != ANSWER or len(ids) != len(set(ids)):
        figures.fail(f"task {task_id} ended {events[-1][0]}: {_text(events)!r}, ids {ids}")
        return
    figures.ok("tasks")


def _load(url: str, once: Callable[[httpx.Client, Figures], None], figures: Figures, stop: threading.Event) -> None:
    # Each request on a connection of its own: a kept-alive one that nginx's old worker closes
    # at a reload races the next request sent on it ("disconnected without sending a
    # response"), which a client may retry only for an idempotent request (RFC 9112 §9.3.1):
    # that is nginx's reload, not the replicas' restart this measures.
    fresh = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(base_url=url, timeout=httpx.Timeout(60, connect=10), limits=fresh) as client:
        while not stop.is_set():
            once(client, figures)


def rolling_restart(workdir: Path, drain: float = 30.0) -> Figures:
    """Two replicas, nginx in front, STREAMS + TASK_CLIENTS clients in a loop; each replica
    replaced in turn (the new one added once ready, then the old one SIGTERM'd and removed)."""
    figures = Figures()
    with redis_server() as redis_url, postgres_server() as postgres_url:
        replicas = [_replica(workdir / f"r{i}", redis_url, postgres_url, drain) for i in range(2)]
        try:
            with nginx_balancer([r.url for r in replicas]) as balancer:
                stop = threading.Event()
                clients = [
                    threading.Thread(target=_load, args=(balancer.url, once, figures, stop))
                    for once in [_stream_once] * STREAMS + [_task_once] * TASK_CLIENTS
                ]
                started = time.monotonic()
                for t in clients:
                    t.start()
                time.sleep(2)
                for i in range(2):
                    new = _replica(workdir / f"r{i}-new", redis_url, postgres_url, drain)
                    old, replicas[i] = replicas[i], new
                    balancer.set_upstreams([r.url for r in replicas] + [old.url])
                    signalled = time.monotonic()
                    old.proc.send_signal(signal.SIGTERM)
                    old.proc.wait(90)
                    figures.drains_s.append(time.monotonic() - signalled)
                    balancer.set_upstreams([r.url for r in replicas])
                    time.sleep(2)
                stop.set()
                for t in clients:
                    t.join(120)
                figures.wall_s = time.monotonic() - started
                log = balancer.access_log.read_text()
                figures.retried_503 = sum(1 for line in log.splitlines() if " 503, " in line)
        finally:
            for r in replicas:
                r.stop()
    return figures


def test_rolling_restart_fails_no_answer_and_loses_no_event(tmp_path: Path) -> None:
    figures = rolling_restart(tmp_path)
    assert figures.failed == [], figures.failed[:5]
    assert figures.events_lost == 0
    # Load ran through both restarts, and new work did reach a draining replica (and was sent on).
    assert figures.streams >= STREAMS and figures.tasks >= TASK_CLIENTS
    assert figures.retried_503 > 0
    assert len(figures.drains_s) == 2
    print(figures_line(figures))


def figures_line(figures: Figures) -> str:
    return (
        f"rolling restart: {figures.answers} answers ({figures.streams} streams, {figures.tasks} tasks), "
        f"{len(figures.failed)} failed, {figures.events_lost} events lost, {figures.retried_503} sent on after a 503, "
        f"drains {[round(d, 2) for d in figures.drains_s]} s, {figures.wall_s:.1f} s"
    )
