"""Several replicas sharing one PostgreSQL store and one Redis event log
(docs/operations/replicas.md): two real `lmsp serve` processes on the embedded model, real Redis and PostgreSQL
servers started here. Whatever one replica started, the other reads, resumes, cancels,
continues and replays; a replica killed mid-task leaves no task running for ever."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from helpers import (
    KEEPALIVE,
    SCRIPTED,
    TASKS,
    assert_problem,
    body,
    checked_client,
    create_task,
    parse_events,
    read_task_events,
)
from lmsp.testing import RunningServer, isolated_env, start_server
from lmsp.testing_servers import missing_servers, new_database, postgres_server, redis_server
from proxy import Cut, Proxy

pytestmark = pytest.mark.skipif(missing_servers() is not None, reason=str(missing_servers()))

# Short enough for the tests to wait out, long enough that a loaded machine's pauses never
# let a live replica's lease lapse.
LEASE = 3.0
RETENTION = 30.0
CUTS_AT_LEAST = 200
REPLAYS = 5
_ID = re.compile(rb"^id: (\d+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def shared() -> Iterator[tuple[str, str]]:
    with redis_server() as redis_url, postgres_server() as postgres_url:
        yield redis_url, postgres_url


def _replica(workdir: Path, shared: tuple[str, str]) -> RunningServer:
    redis_url, postgres_url = shared
    return start_server(
        workdir,
        "--store", postgres_url,
        "--events", redis_url,
        "--task-lease", str(LEASE),
        "--task-retention", str(RETENTION),
        "--scripted-model", SCRIPTED,
        "--keepalive", "1",
    )  # fmt: skip


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, shared: tuple[str, str]
) -> Iterator[tuple[RunningServer, RunningServer]]:
    a = _replica(tmp_path_factory.mktemp("replica-a"), shared)
    try:
        b = _replica(tmp_path_factory.mktemp("replica-b"), shared)
    except BaseException:
        a.stop()
        raise
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(scope="module")
def clients(replicas: tuple[RunningServer, RunningServer]) -> Iterator[tuple[httpx.Client, httpx.Client]]:
    a, b = replicas
    with checked_client(a.url) as ca, checked_client(b.url) as cb:
        yield ca, cb


@pytest.fixture(scope="module")
def ended_early(clients: tuple[httpx.Client, httpx.Client]) -> tuple[str, int, float]:
    """A task that ends at the start of the module, whose retention the last test waits out:
    (its id, its final event's id, when it ended)."""
    ca, _ = clients
    task = create_task(ca, body("!repeat kept", model=SCRIPTED, max_output_tokens=5))
    _, raw = read_task_events(ca, task["id"])
    return task["id"], parse_events(raw)[-1][0], time.monotonic()


def _frames(raw: bytes) -> bytes:
    """The whole frames in what a cut connection brought (keep-alives taken out)."""
    raw = raw.replace(KEEPALIVE, b"")
    end = raw.rfind(b"\n\n")
    return raw[: end + 2] if end >= 0 else b""


def _random_cuts(rng: random.Random) -> Cut:
    # Mostly short (mid-header, mid-frame: often no whole event at all), now and then long
    # enough to carry the biggest frame (the finished message, a few KB).
    return Cut(rng.randint(1, 400) if rng.random() < 0.9 else rng.randint(400, 6000))


def _read_cut(client: httpx.Client, task_id: str, last_id: int) -> tuple[int, bytes]:
    """One connection through a cutting proxy: (its status, or 0 when cut before the status
    line; the whole frames it brought)."""
    got = bytearray()
    status = 0
    try:
        headers = {"last-event-id": str(last_id)} if last_id else {}
        with client.stream("GET", f"{TASKS}/{task_id}/events", headers=headers) as response:
            status = response.status_code
            for chunk in response.iter_bytes():
                got += chunk
    except httpx.TransportError:
        pass
    return status, _frames(bytes(got))


def _read_alternately(via: list[httpx.Client], task_id: str) -> bytes:
    """A task's events read to the end over connections that are cut, B and A by turns, each
    resuming with Last-Event-ID after the last whole event the one before brought."""
    joined = b""
    last_id = 0
    for n in range(20000):
        status, frames = _read_cut(via[n % 2], task_id, last_id)
        if status == 204:  # resumed after the final event: nothing left
            return joined
        assert status in (0, 200), status
        if frames:
            joined += frames
            last_id = int(_ID.findall(frames)[-1])
    raise AssertionError("the reads made no progress")


def test_a_task_from_a_is_read_on_b_and_resumed_on_both_across_hundreds_of_cuts(
    replicas, clients, ended_early, capsys
):  # covers: R6.4-1, R6.4-2, R7-3
    a, b = replicas
    ca, cb = clients
    assert ended_early  # made first: the last test waits out its retention
    rng = random.Random(16)
    # An answer from the real model: read while it is generated, then replayed once it ended
    # (each read over a few dozen cut connections).
    task = create_task(
        ca, body("Tell a long story about a lighthouse keeper and the sea.", max_output_tokens=150, temperature=0.7)
    )
    with (
        Proxy(b.port, lambda _n: _random_cuts(rng)) as via_b,
        Proxy(a.port, lambda _n: _random_cuts(rng)) as via_a,
        httpx.Client(base_url=via_b.url, timeout=60) as on_b,
        httpx.Client(base_url=via_a.url, timeout=60) as on_a,
    ):
        live = _read_alternately([on_b, on_a], task["id"])
        replays = [_read_alternately([on_b, on_a], task["id"]) for _ in range(REPLAYS)]
        cuts = via_a.cuts + via_b.cuts
    _, whole_on_b = read_task_events(cb, task["id"])
    _, whole_on_a = read_task_events(ca, task["id"])
    assert live == whole_on_b == whole_on_a
    assert replays == [live] * REPLAYS
    events = parse_events(live)
    assert [i for i, _, _ in events] == list(range(1, len(events) + 1))
    assert events[-1][1] in ("response.completed", "response.incomplete")
    assert cuts >= CUTS_AT_LEAST, cuts
    with capsys.disabled():
        print(
            f"\n  replicas: {cuts} cut connections, B and A by turns;"
            f" {len(events)} events read {1 + REPLAYS} times, equal to one read"
        )
    # The record B reads from the shared store is the one A kept.
    assert cb.get(f"{TASKS}/{task['id']}").json() == ca.get(f"{TASKS}/{task['id']}").json()


def test_cancel_through_b_stops_the_generation_on_a(clients):  # covers: R7-5
    ca, cb = clients
    # One word a second for ten minutes: it only ends early if A's generation is stopped.
    task = create_task(ca, body("!slow 1000 " + " ".join(f"w{i}" for i in range(600)), model=SCRIPTED))
    seen_running = cb.get(f"{TASKS}/{task['id']}").json()
    assert seen_running["status"] == "in_progress"
    cancelled = cb.post(f"{TASKS}/{task['id']}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    on_a = ca.get(f"{TASKS}/{task['id']}").json()
    assert on_a["status"] == "cancelled"
    [message] = on_a["response"]["output"]
    assert message["status"] == "incomplete"
    assert len(message["content"][0]["text"].split()) < 600
    for client in (ca, cb):
        events = parse_events(read_task_events(client, task["id"])[1])
        assert events[-1][1] == "response.cancelled"


def test_a_stored_response_from_a_continues_through_b(clients):  # covers: R6.1-6, R6.1-7
    ca, cb = clients
    first = ca.post(
        "/lmsp/v1/responses", json=body("My name is Ada. Say hello.", max_output_tokens=12, temperature=0, store=True)
    )
    assert first.status_code == 200
    assert cb.get(f"/lmsp/v1/responses/{first.json()['id']}").json() == first.json()
    follow = body("What is my name?", max_output_tokens=12, temperature=0, previous_response_id=first.json()["id"])
    second = cb.post("/lmsp/v1/responses", json=follow)
    assert second.status_code == 200, second.text
    assert second.json()["status"] in ("completed", "incomplete")
    assert second.json()["output"][0]["content"][0]["text"]


def _retry(client: httpx.Client, url: str, payload: dict[str, Any], key: str) -> httpx.Response:
    """POSTs as a client retrying with its key does: again after Retry-After while the first
    request is still recording its answer (409 idempotency_conflict: A sends its answer
    before its record of it is committed)."""
    for _ in range(60):
        answer = client.post(url, json=payload, headers={"Idempotency-Key": key})
        if answer.status_code != 409:
            return answer
        assert_problem(answer, 409, "idempotency_conflict")
        time.sleep(float(answer.headers["retry-after"]) / 10)
    raise AssertionError("the first request's answer was never recorded")


def test_an_idempotent_retry_through_b_replays_as_answer(clients):  # covers: R9-3
    ca, cb = clients
    key = str(uuid.uuid4())
    payload = body("Name a colour.", max_output_tokens=8, temperature=1.0)
    first = ca.post("/lmsp/v1/responses", json=payload, headers={"Idempotency-Key": key})
    again = _retry(cb, "/lmsp/v1/responses", payload, key)
    assert first.status_code == again.status_code == 200
    assert again.content == first.content  # the same response: B ran nothing
    assert again.headers["idempotent-replayed"] == "true"
    # A task too: the retry through B is the same task.
    task_key = str(uuid.uuid4())
    task_body = body("!repeat t", model=SCRIPTED, max_output_tokens=3)
    made = ca.post(TASKS, json=task_body, headers={"Idempotency-Key": task_key})
    retried = _retry(cb, TASKS, task_body, task_key)
    assert made.status_code == retried.status_code == 202
    assert retried.json()["id"] == made.json()["id"]
    assert_problem(
        cb.post(TASKS, json={**task_body, "max_output_tokens": 4}, headers={"Idempotency-Key": task_key}),
        422,
        "idempotency_key_reused",
    )


def test_a_replica_killed_mid_task_leaves_nothing_running_for_ever(tmp_path, shared, clients):  # covers: R7-3, R9-3
    _, cb = clients
    doomed = _replica(tmp_path, shared)
    events: list[tuple[int, str, Any]] = []
    key = str(uuid.uuid4())
    claimed = body("!slow 100 a b c d e", model=SCRIPTED)
    try:
        with checked_client(doomed.url) as cd:
            task = create_task(cd, body("!slow 500 " + " ".join(f"w{i}" for i in range(600)), model=SCRIPTED))
        # A request with a key that the doomed replica holds (queued behind the task) when it dies.
        threading.Thread(target=_post_and_lose, args=(doomed.url, claimed, key), daemon=True).start()
        _until(lambda: _claim_in_store(shared[1], key))
        reading = threading.Event()

        def follow_on_b() -> None:
            with cb.stream("GET", f"{TASKS}/{task['id']}/events") as response:
                raw = b""
                for chunk in response.iter_bytes():
                    raw += chunk
                    if b"response.output_text.delta" in raw:
                        reading.set()
            events.extend(parse_events(raw.replace(KEEPALIVE, b"")))

        follower = threading.Thread(target=follow_on_b)
        follower.start()
        assert reading.wait(60), "B never got the task's first words"
    finally:
        os.kill(doomed.proc.pid, signal.SIGKILL)
        doomed.proc.wait()
    follower.join(120)
    assert not follower.is_alive(), "B's reader still waits: the dead replica's task never ended"
    assert events[-1][1] == "response.failed"
    assert events[-1][2]["error"]["code"] == "generation_failed"
    assert [i for i, _, _ in events] == list(range(1, len(events) + 1))
    final = cb.get(f"{TASKS}/{task['id']}").json()
    assert final["status"] == "failed"
    assert final["response"]["error"]["code"] == "generation_failed"
    # Resuming after the failed event: nothing left; from the start: the same events again.
    assert read_task_events(cb, task["id"], after=events[-1][0])[0].status_code == 204
    assert parse_events(read_task_events(cb, task["id"])[1]) == events
    # The dead replica's claim is freed once it is unseen for three leases: the retry runs.
    retried: list[httpx.Response] = []
    _until(
        lambda: (
            retried.append(cb.post("/lmsp/v1/responses", json=claimed, headers={"Idempotency-Key": key}))
            or retried[-1].status_code != 409
        )
    )
    assert retried[-1].status_code == 200, retried[-1].text
    assert retried[-1].json()["output"][0]["content"][0]["text"] == "a b c d e"


def _claim_in_store(postgres_url: str, key: str) -> bool:
    import psycopg

    with psycopg.connect(postgres_url) as conn:
        return (
            conn.execute("SELECT 1 FROM idempotency WHERE key = %s AND status IS NULL", (key,)).fetchone() is not None
        )


def _post_and_lose(url: str, payload: dict[str, Any], key: str) -> None:
    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            c.post("/lmsp/v1/responses", json=payload, headers={"Idempotency-Key": key})
    except httpx.TransportError:
        pass  # its replica was killed


def _until(done: Any, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def token_replicas(
    tmp_path_factory: pytest.TempPathFactory, shared: tuple[str, str]
) -> Iterator[tuple[str, RunningServer, RunningServer]]:
    """Two replicas on a database of their own (the replicas above serve without tokens), each
    with its own data folder: only the store can give them the same tokens."""
    redis_url, postgres_url = shared
    store_url = new_database(postgres_url, "lmsp_tokens")
    a = _replica(tmp_path_factory.mktemp("token-a"), (redis_url, store_url))
    try:
        b = _replica(tmp_path_factory.mktemp("token-b"), (redis_url, store_url))
    except BaseException:
        a.stop()
        raise
    yield store_url, a, b
    a.stop()
    b.stop()


def _token_cli(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lmsp", "token", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**isolated_env(home), "LMSP_HOME": str(home / "data"), **env},
    )


def _create_token(home: Path, store_url: str, scopes: str, name: str) -> str:
    made = _token_cli(home, "create", "--scopes", scopes, "--name", name, "--store", store_url)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def test_tokens_made_through_the_cli_hold_on_every_replica_until_revoked(
    tmp_path, token_replicas
):  # covers: R10-1, R10-2, R10-4
    store_url, a, b = token_replicas
    full = _create_token(tmp_path, store_url, "models:read,responses:write,responses:read", "shared")
    reader = _create_token(tmp_path, store_url, "models:read", "reader")
    listed = _token_cli(tmp_path, "list", LMSP_STORE=store_url).stdout  # the store named by the environment
    assert f"{full[5:13]}\tshared\tmodels:read,responses:read,responses:write\tactive" in listed
    assert not (tmp_path / "data" / "tokens.sqlite3").exists()  # nothing went to a data folder
    payload = body("!repeat a b", model=SCRIPTED, max_output_tokens=2)
    with checked_client(a.url) as ca, checked_client(b.url) as cb:
        for c in (ca, cb):
            assert_problem(c.get("/lmsp/v1/models"), 401, "authentication_required", "Authorization")
            assert c.get("/lmsp/v1/models", headers=_bearer(full)).status_code == 200
            assert c.post("/lmsp/v1/responses", json=payload, headers=_bearer(full)).status_code == 200
            assert c.get("/lmsp/v1/models", headers=_bearer(reader)).status_code == 200
        # The reader's scopes hold on B as on A: no responses:write.
        doc = assert_problem(
            cb.post("/lmsp/v1/responses", json=payload, headers=_bearer(reader)),
            403,
            "insufficient_scope",
            "Authorization",
        )
        assert "responses:write" in doc["detail"]
        revoked = _token_cli(tmp_path, "revoke", "shared", "--store", store_url)
        assert revoked.stdout.strip() == f"revoked {full[5:13]}", revoked.stderr
        for c in (ca, cb):  # the next request on each, on connections opened before the revoke
            assert_problem(c.get("/lmsp/v1/models", headers=_bearer(full)), 401, "invalid_token", "Authorization")
            assert c.get("/lmsp/v1/models", headers=_bearer(reader)).status_code == 200
    assert (
        f"{full[5:13]}\tshared\tmodels:read,responses:read,responses:write\trevoked"
        in _token_cli(tmp_path, "list", LMSP_STORE=store_url).stdout
    )


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_410_after_retention_on_both(clients, ended_early):  # covers: R6.4-3
    task_id, final_id, ended_at = ended_early
    time.sleep(max(0.0, ended_at + RETENTION + 1.0 - time.monotonic()))
    for client in clients:
        assert_problem(read_task_events(client, task_id)[0], 410, "event_history_expired")
        assert_problem(read_task_events(client, task_id, last_event_id=final_id - 1)[0], 410, "event_history_expired")
        assert read_task_events(client, task_id, after=final_id)[0].status_code == 204
        assert client.get(f"{TASKS}/{task_id}").json()["status"] == "incomplete"
