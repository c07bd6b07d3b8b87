"""The store failing in the middle of deleting or bounding (issue 38), through a real `lmsp serve`
on its embedded SQLite store. The fault is injected into that real database from outside the
process, as an operator's mistake or a full disk would reach it: a trigger that aborts the
statement, added and removed by a second connection to the server's own file.

- A DELETE that fails part-way leaves every copy readable (nothing half-deleted), and its retry
  finishes the job: before, the response went in one call and its task record and replay body
  in a second; when the second failed, the retry answered 404 and GET on the task still served
  the whole response.
- A trim past the quota that fails after the response was stored does not turn the stored,
  generated response into `storage_failed`; the trim is retried in the background."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import SCRIPTED, TASKS, body, checked_client, create_task, wait_final
from lmsp.state.sqlite import STORE_FILE
from lmsp.testing import RunningServer, start_server


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(tmp_path_factory.mktemp("store-faults"), "--scripted-model", SCRIPTED, "--store-quota", "1")
    yield srv
    srv.stop()


def _store_file(srv: RunningServer) -> Path:
    home = Path(str(srv.log_path.parent / f"home-{srv.port}"))
    return home / STORE_FILE


@contextmanager
def _refusing_deletes(srv: RunningServer, table: str) -> Iterator[None]:
    """Every DELETE from `table` in the server's store aborts, until the block ends."""
    db = sqlite3.connect(_store_file(srv), isolation_level=None)
    try:
        db.execute("PRAGMA busy_timeout=5000")
        db.execute(
            f"CREATE TRIGGER injected_fault BEFORE DELETE ON {table} BEGIN SELECT RAISE(ABORT, 'injected fault'); END"
        )
        yield
    finally:
        db.execute("DROP TRIGGER IF EXISTS injected_fault")
        db.close()


def test_a_delete_that_fails_part_way_leaves_every_copy_and_its_retry_finishes(service: RunningServer) -> None:
    with checked_client(service.url) as client:
        payload = body("secret words", model=SCRIPTED, store=True)
        key = {"Idempotency-Key": f"fault-{time.time_ns()}"}
        created = create_task(client, payload, key)
        task = wait_final(client, created["id"])
        response_id = task["response_id"]

        with _refusing_deletes(service, "tasks"):
            failed = client.delete(f"/v1/responses/{response_id}")
            assert failed.status_code == 500, failed.text
            assert failed.json()["error"]["code"] == "storage_failed"
            # Nothing half-done: the response is still there to read, and to delete again.
            assert client.get(f"/v1/responses/{response_id}").status_code == 200
            assert client.get(f"{TASKS}/{task['id']}").status_code == 200

        retry = client.delete(f"/v1/responses/{response_id}")
        assert retry.status_code == 200, retry.text
        assert retry.json() == {"id": response_id, "object": "response", "deleted": True}
        gone = client.get(f"{TASKS}/{task['id']}")
        assert gone.status_code == 404 and "secret" not in gone.text
        assert client.get(f"/v1/responses/{response_id}").status_code == 404
        again = client.post(TASKS, json=payload, headers=key)  # nothing left to replay
        assert again.status_code == 202 and "idempotent-replayed" not in again.headers
        wait_final(client, again.json()["id"])  # stored before the next test counts the quota
        assert client.delete(f"/v1/responses/{response_id}").status_code == 404  # done: same state


def test_a_failed_trim_after_a_stored_response_is_no_storage_failure(service: RunningServer) -> None:
    with checked_client(service.url) as client:
        first = client.post("/v1/responses", json=body("one", model=SCRIPTED, store=True))
        assert first.status_code == 200, first.text
        with _refusing_deletes(service, "responses"):
            second = client.post("/v1/responses", json=body("two", model=SCRIPTED, store=True))
            assert second.status_code == 200, second.text
            assert second.json()["status"] == "completed", second.text
            assert second.json().get("error") is None
            # Both kept for now: the quota (1) waits for the store.
            assert client.get(f"/v1/responses/{second.json()['id']}").status_code == 200
            assert client.get(f"/v1/responses/{first.json()['id']}").status_code == 200
        # Retried in the background (1 s, then doubling): the older one goes.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and client.get(f"/v1/responses/{first.json()['id']}").status_code == 200:
            time.sleep(0.25)
        assert client.get(f"/v1/responses/{first.json()['id']}").status_code == 404
        assert client.get(f"/v1/responses/{second.json()['id']}").status_code == 200
