"""Stored responses are bounded (issue 28): `--store-retention` forgets those older than it, on a
periodic sweep, and `--store-quota` and `--store-quota-bytes` keep each owner's newest only; an idempotency record keeps
at most `--idempotency-max-body` of its answer. The store backends' part is in
tests/contract/test_store_contract.py; this is the flags, through a real `lmsp serve`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from helpers import SCRIPTED, TASKS, body, checked_client, create_task, read_task_events, wait_final
from lmsp.testing import RunningServer, isolated_env, start_server

REPLAY_BOUND = 4096
QUOTA_BYTES = 64 * 1024


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    workdir: Path = tmp_path_factory.mktemp("retention")
    # The retention through its environment variable, the quota through its flag.
    env = isolated_env(workdir / "user", LMSP_STORE_RETENTION="2s")
    srv = start_server(
        workdir,
        "--scripted-model",
        SCRIPTED,
        "--store-quota",
        "2",
        "--store-quota-bytes",
        str(QUOTA_BYTES),
        "--idempotency-max-body",
        str(REPLAY_BOUND),
        # A task's events (and the copy of it this process keeps with them) for 0.3 s: past
        # that, its record alone answers, as it does after the default 5 minutes.
        "--task-retention",
        "0.3",
        env=env,
    )
    yield srv
    srv.stop()


def _store(client: httpx.Client, text: str) -> str:
    answer = client.post("/v1/responses", json=body(text, model=SCRIPTED, store=True))
    assert answer.status_code == 200, answer.text
    return str(answer.json()["id"])


def test_past_the_quota_the_oldest_go_and_past_the_retention_all(service: RunningServer) -> None:
    with checked_client(service.url) as client:
        ids = [_store(client, f"number {n}") for n in range(3)]
        # The quota (2): the first is gone at once, the two newest are there.
        assert [client.get(f"/v1/responses/{i}").status_code for i in ids] == [404, 200, 200]
        # The retention (2 s, swept every 1 s; created_at is whole seconds): gone within ~4 s.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and client.get(f"/v1/responses/{ids[2]}").status_code == 200:
            time.sleep(0.25)
        assert [client.get(f"/v1/responses/{i}").status_code for i in ids] == [404, 404, 404]
        # A new one is stored and read as before.
        assert client.get(f"/v1/responses/{_store(client, 'after')}").status_code == 200


def test_past_the_byte_quota_the_oldest_go_and_the_newest_stays(service: RunningServer) -> None:
    # The abuse: one long input stored per call. Past the owner's bytes, the older responses go;
    # the newest stays even alone past the bound, and a continuation from it still runs.
    with checked_client(service.url) as client:
        small = _store(client, "small")
        large = _store(client, "x" * QUOTA_BYTES)  # one scripted "token": it fits the window
        assert [client.get(f"/v1/responses/{i}").status_code for i in (small, large)] == [404, 200]
        payload = body("and then?", model=SCRIPTED, store=True, previous_response_id=large)
        answer = client.post("/v1/responses", json=payload)
        assert answer.status_code == 200, answer.text
        # It holds the long input again (the history): the one before it goes.
        assert client.get(f"/v1/responses/{large}").status_code == 404


def test_an_answer_past_the_replay_bound_is_a_409_on_retry_not_a_second_run(service: RunningServer) -> None:
    with checked_client(service.url) as client:
        small = body("short", model=SCRIPTED)
        first = client.post("/v1/responses", json=small, headers={"Idempotency-Key": "small-1"})
        again = client.post("/v1/responses", json=small, headers={"Idempotency-Key": "small-1"})
        assert len(first.content) <= REPLAY_BOUND
        assert again.headers.get("idempotent-replayed") == "true"
        assert again.content == first.content

        large = body("long " * 2000, model=SCRIPTED, stream=True)
        first = client.post("/v1/responses", json=large, headers={"Idempotency-Key": "large-1"})
        assert first.status_code == 200
        assert len(first.content) > REPLAY_BOUND
        again = client.post("/v1/responses", json=large, headers={"Idempotency-Key": "large-1"})
        assert again.status_code == 409, again.text
        error = again.json()["error"]
        assert error["code"] == "idempotency_conflict"
        assert error["param"] == "Idempotency-Key"
        assert str(REPLAY_BOUND) in error["message"]


def test_delete_removes_the_response_from_its_task_record_events_and_replay(server: RunningServer) -> None:
    # Before: the task's record, its events and the idempotency answer still held the content.
    with checked_client(server.url) as client:
        payload = body("secret words", model=SCRIPTED, store=True)
        key = {"Idempotency-Key": f"delete-{time.time_ns()}"}
        created = create_task(client, payload, key)
        task = wait_final(client, created["id"])
        response_id = task["response_id"]
        assert client.get(f"{TASKS}/{task['id']}").status_code == 200
        assert client.delete(f"/v1/responses/{response_id}").status_code == 200

        gone = client.get(f"{TASKS}/{task['id']}")
        assert gone.status_code == 404 and "secret" not in gone.text
        events, raw = read_task_events(client, task["id"])
        assert events.status_code == 404 and b"secret" not in raw
        retry = client.post(TASKS, json=payload, headers=key)  # runs again: nothing to replay
        assert retry.status_code == 202 and "idempotent-replayed" not in retry.headers
        assert retry.json()["id"] != task["id"]


def test_task_records_fall_under_the_quota_and_the_retention(service: RunningServer) -> None:  # covers: R7-5
    # Issue 38: a task's record holds its whole response, `store: false` too; before, records
    # were kept for ever, whatever the quota and the retention.
    with checked_client(service.url) as client:
        tasks = []
        for n in range(3):
            created = create_task(client, body(f"task number {n}", model=SCRIPTED, store=False))
            tasks.append(wait_final(client, created["id"])["id"])
        time.sleep(0.5)  # their events expired: the records answer
        # The quota (2): the oldest record is gone once the third is final; the newest is there.
        assert client.get(f"{TASKS}/{tasks[0]}").status_code == 404
        assert client.get(f"{TASKS}/{tasks[2]}").status_code == 200
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline and client.get(f"{TASKS}/{tasks[2]}").status_code == 200:
            time.sleep(0.25)
        assert [client.get(f"{TASKS}/{t}").status_code for t in tasks] == [404, 404, 404]
