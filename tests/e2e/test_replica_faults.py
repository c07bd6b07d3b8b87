"""Replicas whose shared servers have a bad minute (issue 27; docs/operations/replica-faults.md):
two real `lmsp serve` replicas on one real Redis and one real PostgreSQL, started here, and
faults injected only with signals and commands on those processes, mid-task. For each: the
task's record and its events agree, every reader gets every event through the final one
(resuming as a client does) or a clear 410, nothing is run twice, and unrelated requests keep
answering or get a fast 503. The figures measured (longest silence on an open stream during a
database stall, time to the final event, time to 503) are printed with `-s`.

Each reader gives up past READ_BOUND: a reader still waiting then fails the test."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from helpers import KEEPALIVE, SCRIPTED, TASKS, body, create_task, parse_events
from lmsp.testing import RunningServer, free_port, start_server
from lmsp.testing_servers import RedisProcess, missing_servers, postgres_pids, postgres_server, redis_process

pytestmark = pytest.mark.skipif(missing_servers() is not None, reason=str(missing_servers()))

LEASE = 3.0
KEEPALIVE_S = 1.0
READ_BOUND = 60.0  # no reader waits longer than this for the final event
FINALS = ("response.completed", "response.incomplete")
# One word every WORD_MS: long enough to inject a fault mid-task and see it heal.
WORD_MS = 150


def _words(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[RedisProcess, str]]:
    with redis_process() as r, postgres_server() as postgres_url:
        yield r, postgres_url


def _replica(workdir: Path, redis_url: str, postgres_url: str) -> RunningServer:
    return start_server(
        workdir,
        "--store", postgres_url,
        "--events", redis_url,
        "--task-lease", str(LEASE),
        "--task-retention", "60",
        "--scripted-model", SCRIPTED,
        "--keepalive", str(KEEPALIVE_S),
    )  # fmt: skip


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, servers: tuple[RedisProcess, str]
) -> Iterator[tuple[RunningServer, RunningServer]]:
    r, postgres_url = servers
    a = _replica(tmp_path_factory.mktemp("fault-a"), r.url, postgres_url)
    try:
        b = _replica(tmp_path_factory.mktemp("fault-b"), r.url, postgres_url)
    except BaseException:
        a.stop()
        raise
    yield a, b
    a.stop()
    b.stop()


class Reader(threading.Thread):
    """Reads a task's events to the final one as a client does: a dropped connection or a
    stream that ends early is resumed with Last-Event-ID, a 503 retried after Retry-After.
    Ends with the final event, or a 410 (`expired`); notes the longest silence on the wire."""

    def __init__(self, url: str, task_id: str) -> None:
        super().__init__(daemon=True)
        self.url, self.task_id = url, task_id
        self.raw = b""
        self.last_id = 0
        self.expired = False
        self.statuses: list[int] = []
        self.longest_silence = 0.0
        self.ended_at: float | None = None

    def run(self) -> None:
        deadline = time.monotonic() + READ_BOUND
        with httpx.Client(base_url=self.url, timeout=httpx.Timeout(10.0, read=10.0)) as client:
            while time.monotonic() < deadline:
                try:
                    if self._once(client):
                        self.ended_at = time.monotonic()
                        return
                except httpx.TransportError:
                    time.sleep(0.2)

    def _once(self, client: httpx.Client) -> bool:
        headers = {"last-event-id": str(self.last_id)} if self.last_id else {}
        with client.stream("GET", f"{TASKS}/{self.task_id}/events", headers=headers) as response:
            self.statuses.append(response.status_code)
            if response.status_code == 410:
                self.expired = True
                return True
            if response.status_code == 204:
                return True
            if response.status_code >= 500:
                time.sleep(float(response.headers.get("retry-after", "1")))
                return False
            assert response.status_code == 200, response.status_code
            seen = time.monotonic()
            pending = b""
            for chunk in response.iter_raw():
                now = time.monotonic()
                self.longest_silence = max(self.longest_silence, now - seen)
                seen = now
                pending += chunk
                end = pending.rfind(b"\n\n")
                if end < 0:
                    continue
                whole, pending = pending[: end + 2].replace(KEEPALIVE, b""), pending[end + 2 :]
                if b"event: error" in whole and b"event_history_expired" in whole:  # the copy lost them
                    self.expired = True
                    return True
                if whole:
                    self.raw += whole
                    self.last_id = parse_events(whole)[-1][0]
                    if any(name.encode() in whole for name in (*FINALS, "response.failed", "response.cancelled")):
                        return True
        return False

    def events(self) -> list[tuple[int, str, Any]]:
        return parse_events(self.raw)


def _start_readers(urls: list[str], task_id: str) -> list[Reader]:
    readers = [Reader(url, task_id) for url in urls]
    for reader in readers:
        reader.start()
    return readers


def _finish(readers: list[Reader]) -> None:
    for reader in readers:
        reader.join(READ_BOUND + 5)
        assert not reader.is_alive(), "a reader still waits for the final event"


def _assert_whole(reader: Reader, words: int) -> list[tuple[int, str, Any]]:
    """Every event through the final one, each once and in order, and the whole text."""
    events = reader.events()
    assert [i for i, _, _ in events] == list(range(1, len(events) + 1)), [i for i, _, _ in events]
    assert events[-1][1] in FINALS, events[-1]
    text = "".join(d["delta"] for _, n, d in events if n == "response.output_text.delta")
    assert text.split() == _words(words).split()
    return events


def _record(url: str, task_id: str) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=30) as client:
        deadline = time.monotonic() + 30
        while True:
            got = client.get(f"{TASKS}/{task_id}")
            if got.status_code == 200 and got.json()["status"] != "in_progress":
                task: dict[str, Any] = got.json()
                return task
            assert time.monotonic() < deadline, got.text
            time.sleep(0.2)


def _task_on_a(a: RunningServer, words: int) -> dict[str, Any]:
    with httpx.Client(base_url=a.url, timeout=30) as client:
        return create_task(client, body(f"!slow {WORD_MS} {_words(words)}", model=SCRIPTED))


def _ok_after(readers: list[Reader], a: RunningServer, b: RunningServer, task_id: str, words: int) -> None:
    _finish(readers)
    for reader in readers:
        assert not reader.expired, reader.statuses
        _assert_whole(reader, words)
    on_a, on_b = _record(a.url, task_id), _record(b.url, task_id)
    assert on_a == on_b
    assert on_a["status"] == "completed", on_a  # not `failed`: no sibling ended it
    assert readers[0].raw == readers[1].raw


def _report(capsys: pytest.CaptureFixture[str], line: str) -> None:
    with capsys.disabled():
        print(f"\n  faults: {line}")


def test_redis_stopped_for_3_s_mid_task(replicas, servers, capsys):
    a, b = replicas
    r, _ = servers
    task = _task_on_a(a, 40)
    started = time.monotonic()
    readers = _start_readers([b.url, a.url], task["id"])
    time.sleep(1.5)
    os.kill(r.proc.pid, signal.SIGSTOP)
    try:
        time.sleep(3)
    finally:
        os.kill(r.proc.pid, signal.SIGCONT)
    _ok_after(readers, a, b, task["id"], 40)
    _report(capsys, f"Redis SIGSTOP 3 s: final event on B after {readers[0].ended_at - started:.1f} s (run ~6 s)")


def test_redis_shut_down_without_saving_and_restarted_empty(replicas, servers, capsys):
    a, b = replicas
    r, _ = servers
    task = _task_on_a(a, 40)
    started = time.monotonic()
    readers = _start_readers([b.url, a.url], task["id"])
    time.sleep(1.5)
    try:
        redis.Redis.from_url(r.url).shutdown(nosave=True)
    except redis.ConnectionError:
        pass  # it went away while answering
    time.sleep(1.0)
    r.restart()
    _ok_after(readers, a, b, task["id"], 40)
    # The owner wrote the task's events again from its ring: a new reader reads them all.
    late = _start_readers([b.url], task["id"])
    _finish(late)
    assert late[0].expired or late[0].raw == readers[0].raw
    _report(
        capsys,
        f"Redis SHUTDOWN NOSAVE + restart: final event on B after {readers[0].ended_at - started:.1f} s;"
        f" a reader from 0 afterwards: {'410' if late[0].expired else 'every event'}",
    )


def test_redis_failover_to_a_replica_of_an_absent_master(replicas, servers, capsys):
    a, b = replicas
    r, _ = servers
    task = _task_on_a(a, 40)
    started = time.monotonic()
    readers = _start_readers([b.url, a.url], task["id"])
    time.sleep(1.5)
    admin = redis.Redis.from_url(r.url)
    admin.replicaof("127.0.0.1", str(free_port()))  # writes now answer READONLY
    try:
        time.sleep(3)
    finally:
        admin.replicaof("NO", "ONE")
    _ok_after(readers, a, b, task["id"], 40)
    _report(capsys, f"REPLICAOF absent master 3 s: final event on B after {readers[0].ended_at - started:.1f} s")


def test_redis_flushall_mid_task(replicas, servers, capsys):
    a, b = replicas
    r, _ = servers
    task = _task_on_a(a, 40)
    started = time.monotonic()
    readers = _start_readers([b.url, a.url], task["id"])
    time.sleep(2.0)
    redis.Redis.from_url(r.url).flushall()
    _ok_after(readers, a, b, task["id"], 40)
    # The stream now starts after the flushed events: from the start, a clear 410.
    with httpx.Client(base_url=b.url, timeout=30) as client:
        fresh = client.get(f"{TASKS}/{task['id']}/events", headers={"last-event-id": "1"})
    assert fresh.status_code in (200, 410), fresh.status_code
    if fresh.status_code == 410:
        assert fresh.json()["code"] == "event_history_expired"
    _report(
        capsys,
        f"FLUSHALL: final event on B after {readers[0].ended_at - started:.1f} s; resume after 1: {fresh.status_code}",
    )


def test_postgresql_stopped_for_12_s_while_a_stream_is_read(replicas, servers, capsys):
    a, b = replicas
    _, postgres_url = servers
    words = 60  # 9 s of words: the task ends while the database is stopped
    task = _task_on_a(a, words)
    started = time.monotonic()
    readers = _start_readers([a.url, b.url], task["id"])
    time.sleep(1.0)
    pids = postgres_pids(postgres_url)
    assert pids
    timings: dict[str, float] = {}
    key, retried_body = str(uuid.uuid4()), body("!repeat x", model=SCRIPTED, max_output_tokens=3)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        with httpx.Client(base_url=a.url, timeout=30) as ca, httpx.Client(base_url=b.url, timeout=30) as cb:
            t = time.monotonic()
            assert ca.get("/lmsp/v1/models").status_code == 200  # no database needed
            timings["models"] = time.monotonic() - t
            t = time.monotonic()
            unknown = cb.get(f"{TASKS}/task_{uuid.uuid4().hex}")
            timings["get_503"] = time.monotonic() - t
            assert unknown.status_code == 503, unknown.text
            assert unknown.json()["code"] == "service_unavailable" and "retry-after" in unknown.headers
            assert "127.0.0.1" not in unknown.text and "postgres" not in unknown.text.lower()
            t = time.monotonic()
            refused = ca.post(TASKS, json=retried_body, headers={"Idempotency-Key": key})
            timings["create_503"] = time.monotonic() - t
            assert refused.status_code == 503, refused.text
        time.sleep(max(0.0, stopped_at + 12 - time.monotonic()))
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    _finish(readers)
    for reader in readers:
        _assert_whole(reader, words)
    owner = readers[0]
    assert owner.longest_silence < KEEPALIVE_S + 1.0, owner.longest_silence
    assert _record(a.url, task["id"])["status"] == "completed"
    # The key the refused request claimed as the database stalled is free again: a retry
    # through B runs (once), not 409 for a day.
    with httpx.Client(base_url=b.url, timeout=30) as cb:
        deadline = time.monotonic() + 30
        while (retry := cb.post(TASKS, json=retried_body, headers={"Idempotency-Key": key})).status_code in (409, 503):
            assert time.monotonic() < deadline, retry.text
            time.sleep(0.5)
        assert retry.status_code == 202, retry.text
        assert "idempotent-replayed" not in retry.headers
    _report(
        capsys,
        f"PostgreSQL SIGSTOP 12 s: longest silence on A's stream {owner.longest_silence:.2f} s"
        f" (keep-alive {KEEPALIVE_S:.0f} s); on B's {readers[1].longest_silence:.2f} s;"
        f" final event after {owner.ended_at - started:.1f} s; GET /models {timings['models'] * 1000:.0f} ms;"
        f" 503 for a task lookup in {timings['get_503']:.1f} s, for a new task in {timings['create_503']:.1f} s",
    )


def test_one_idempotency_key_sent_to_a_and_b_at_once_runs_once(replicas):
    a, b = replicas
    key = str(uuid.uuid4())
    payload = body(f"!slow 50 {_words(5)}", model=SCRIPTED)
    answers: dict[str, httpx.Response] = {}
    go = threading.Barrier(2)

    def post(name: str, url: str) -> None:
        with httpx.Client(base_url=url, timeout=30) as client:
            go.wait()
            for _ in range(100):
                answer = client.post(TASKS, json=payload, headers={"Idempotency-Key": key})
                if answer.status_code != 409:
                    break
                time.sleep(0.1)
            answers[name] = answer

    threads = [threading.Thread(target=post, args=(n, u)) for n, u in (("a", a.url), ("b", b.url))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers["a"].status_code == answers["b"].status_code == 202, (answers["a"].text, answers["b"].text)
    assert answers["a"].json()["id"] == answers["b"].json()["id"]  # one task, not two
    assert [x.headers.get("idempotent-replayed") for x in answers.values()].count("true") == 1


def test_junk_on_the_cancel_channel_leaves_cancelling_working(replicas, servers):
    a, b = replicas
    r, _ = servers
    junk = redis.Redis.from_url(r.url)
    for message in (b"\xff\xfe not UTF-8", b"", b"task_" + b"\x00" * 40):
        junk.publish("lmsp:cancel", message)
    task = _task_on_a(a, 200)
    with httpx.Client(base_url=b.url, timeout=30) as cb:
        cancelled = cb.post(f"{TASKS}/{task['id']}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"


def test_a_replica_killed_mid_task_ends_it_failed_for_its_readers(tmp_path, replicas, servers, capsys):
    _, b = replicas
    r, postgres_url = servers
    doomed = _replica(tmp_path, r.url, postgres_url)
    try:
        task = _task_on_a(doomed, 400)  # a minute of words: it only ends because its replica dies
        readers = _start_readers([b.url], task["id"])
        time.sleep(1.5)
    finally:
        os.kill(doomed.proc.pid, signal.SIGKILL)
        doomed.proc.wait()
    killed_at = time.monotonic()
    _finish(readers)
    [reader] = readers
    events = reader.events()
    assert [i for i, _, _ in events] == list(range(1, len(events) + 1))
    assert events[-1][1] == "response.failed", events[-1]
    assert events[-1][2]["error"]["code"] == "generation_failed"
    record = _record(b.url, task["id"])
    assert record["status"] == "failed"
    assert reader.ended_at is not None
    _report(
        capsys,
        f"kill -9 of the owner: final `failed` event on B {reader.ended_at - killed_at:.1f} s after the kill"
        f" (lease {LEASE:.0f} s)",
    )
