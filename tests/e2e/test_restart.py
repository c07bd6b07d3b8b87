"""What survives the process: stored responses across a kill -9 (R6.1-5, R6.1-7), what a
stream gets when the service stops under it (the `error` event, R6.3-2, R6.3-3), and that a
task it stopped reads, after a restart, as its readers saw it end."""

from __future__ import annotations

import signal
import time

import httpx
import orjson
import pytest

from helpers import (
    MODEL,
    SCRIPTED,
    TASKS,
    assert_problem,
    body,
    check_event,
    checked_client,
    create_task,
    read_task_events,
    stream,
    sync_behind_a_duplicate,
)
from lmsp.client import iter_events
from lmsp.testing import start_server

URL = "/lmsp/v1/responses"


def test_stored_response_survives_kill_9(tmp_path):  # covers: R6.1-5, R6.1-7, R6.2-6
    data = tmp_path / "data"
    first = start_server(tmp_path, "--scripted-model", SCRIPTED, "--data-dir", str(data))
    try:
        with checked_client(first.url) as c:
            synced = c.post(URL, json=body("kept across a crash", model=SCRIPTED, store=True)).json()
            _, events = stream(c, body("streamed then kept", model=SCRIPTED, store=True))
            # No pause: SIGKILL the moment the client has its answer. What was returned must
            # already be on disk.
            first.proc.send_signal(signal.SIGKILL)
        first.proc.wait(timeout=10)
    finally:
        first.stop()
    streamed_id = events[0][2]["response_id"]
    assert events[-1][1] == "response.completed"

    second = start_server(tmp_path, "--scripted-model", SCRIPTED, "--data-dir", str(data))
    try:
        with checked_client(second.url) as c:
            assert c.get(f"{URL}/{synced['id']}").json() == synced
            streamed = c.get(f"{URL}/{streamed_id}").json()
            assert streamed["output"][0]["content"][0]["text"] == "streamed then kept"
            # and the conversation goes on in the new process
            cont = c.post(URL, json=body("next", model=SCRIPTED, previous_response_id=synced["id"])).json()
            assert cont["usage"]["input_tokens"] > synced["usage"]["input_tokens"]
    finally:
        second.stop()


def test_data_dir_defaults_to_lmsp_home(tmp_path):  # covers: R6.1-5
    # start_server sets LMSP_HOME per server; without --data-dir the store goes there.
    srv = start_server(tmp_path, "--scripted-model", SCRIPTED)
    try:
        with checked_client(srv.url) as c:
            c.post(URL, json=body("x", model=SCRIPTED, store=True))
    finally:
        srv.stop()
    assert list(tmp_path.glob(f"home-{srv.port}/lmsp.sqlite3"))


def test_shutdown_ends_open_streams_with_an_error_event(tmp_path):  # covers: R6.3-2, R6.3-3
    srv = start_server(tmp_path, "--scripted-model", SCRIPTED)
    try:
        events = []
        with (
            checked_client(srv.url, timeout=30) as c,
            c.stream("POST", URL, json=body("!slow 300 " + "w " * 100, model=SCRIPTED, stream=True)) as r,
        ):
            for e in iter_events(r.iter_bytes()):
                events.append((int(e.id), e.event, orjson.loads(e.data)))
                if e.event == "response.output_text.delta" and len(events) == 3:
                    srv.proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert srv.proc.wait(timeout=20) == 0
        assert time.monotonic() - stopped < 10
    finally:
        srv.stop()
    name, data = events[-1][1], events[-1][2]
    assert name == "error"
    check_event(name, data)
    assert data["error"]["code"] == "service_unavailable"
    assert data["error"]["status"] == 503
    assert [i for i, _, _ in events] == list(range(1, len(events) + 1))
    assert sum(n in ("response.completed", "response.cancelled", "error") for _, n, _ in events) == 1


def test_waiting_sync_request_gets_503_at_shutdown(tmp_path):  # covers: R6.2-5
    srv = start_server(tmp_path, "--scripted-model", SCRIPTED)
    try:
        with (
            checked_client(srv.url, timeout=30) as c,
            c.stream("POST", URL, json=body("!slow 300 " + "w " * 100, model=SCRIPTED, stream=True)) as r,
        ):
            lines = r.iter_lines()
            next(lines)
            # A sync request queued behind the stream (the scripted model plays one at a time),
            # sent twice with one Idempotency-Key: the 409 of one says the other is in the service.
            refused, waiting = sync_behind_a_duplicate(srv.url, body("late", model=SCRIPTED))
            assert_problem(refused, 409, "idempotency_conflict")
            srv.proc.send_signal(signal.SIGTERM)
            for _ in lines:
                pass
            assert_problem(waiting.result(timeout=20), 503, "service_unavailable")
    finally:
        srv.stop()


# The scripted model's answer takes 30 s: surely still running at SIGTERM. The real model's may
# end first on a fast machine; whatever its end, the record must agree with it.
STOPPED_MID_TASK = [
    pytest.param(
        ("--scripted-model", SCRIPTED), body("!slow 300 " + "w " * 100, model=SCRIPTED, store=True), id="scripted"
    ),
    pytest.param(
        (), body("Write a very long story about a dragon.", model=MODEL, store=True, max_output_tokens=2000), id="real"
    ),
]


@pytest.mark.parametrize(("args", "payload"), STOPPED_MID_TASK)
def test_a_task_stopped_by_sigterm_reads_after_a_restart_as_its_stream_ended(
    tmp_path, args, payload
):  # covers: R6.3-3, R6.4-3, R7-6
    data = tmp_path / "data"
    first = start_server(tmp_path, *args, "--data-dir", str(data))
    events = []
    try:
        with checked_client(first.url, timeout=60) as c:
            task = create_task(c, payload)
            with c.stream("GET", f"{TASKS}/{task['id']}/events") as r:
                for e in iter_events(r.iter_bytes()):
                    events.append((int(e.id), e.event, orjson.loads(e.data)))
                    if e.event == "response.output_text.delta" and sum(n == e.event for _, n, _ in events) == 3:
                        first.proc.send_signal(signal.SIGTERM)
            try:  # the stopping service may have stopped answering already
                during = c.get(f"{TASKS}/{task['id']}").json()
            except httpx.TransportError:
                during = None
        assert first.proc.wait(timeout=30) == 0
    finally:
        first.stop()
    last_id, name, final = events[-1]
    check_event(name, final)
    assert [i for i, _, _ in events] == list(range(1, last_id + 1))
    if name == "error":
        status, error = "failed", final["error"]
        assert error["code"] == "service_unavailable"
    else:  # it ended on its own before the service stopped
        status, error = final["status"], final.get("error")
    if during is not None:
        assert (during["status"], during["response"]["error"]) == (status, error)

    second = start_server(tmp_path, *args, "--data-dir", str(data))
    try:
        with checked_client(second.url) as c:
            after = c.get(f"{TASKS}/{task['id']}").json()
            assert after["status"] == status
            assert after["response"]["error"] == error
            # The stored response (store: true) is the one its task ended with.
            assert c.get(f"{URL}/{task['response_id']}").json() == after["response"]
            assert read_task_events(c, task["id"], after=last_id)[0].status_code == 204
            assert_problem(c.get(f"{TASKS}/{task['id']}/events"), 410, "event_history_expired")
    finally:
        second.stop()
