"""Tasks (§7) and resuming their events (§6.4) on the real server, over real sockets."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from helpers import (
    SCRIPTED,
    TASKS,
    assert_problem,
    body,
    checked_client,
    create_task,
    has_id,
    parse_events,
    read_task_events,
    stream,
    wait_final,
)
from lmsp.testing import RunningServer, start_server

SLOW = "!slow 40 one two three four five six seven eight nine ten"


def test_create_answers_202_with_location_and_runs_unread(client):  # covers: R7-1
    created = client.post(TASKS, json=body("hello task world", model=SCRIPTED))
    assert created.status_code == 202
    task = created.json()
    assert has_id(task["id"], "task") and has_id(task["response_id"], "resp")
    assert task["object"] == "task"
    assert task["status"] == "in_progress" and task["response"] is None
    assert created.headers["location"] == f"{TASKS}/{task['id']}"
    # Nobody reads its events: it runs to the end anyway.
    final = wait_final(client, task["id"])
    assert final["status"] == "completed"
    assert final["response"]["output"][0]["content"][0]["text"] == "hello task world"


@pytest.mark.parametrize("value", [True, False])
def test_stream_is_refused_in_a_task(client, value):  # covers: R7-1
    assert_problem(client.post(TASKS, json=body("x", model=SCRIPTED, stream=value)), 400, "invalid_request", "stream")


def test_get_holds_the_final_response_folded_from_its_events(client):  # covers: R7-2
    task = create_task(client, body("fold me please", model=SCRIPTED))
    response, raw = read_task_events(client, task["id"])
    events = parse_events(raw)
    final = client.get(f"{TASKS}/{task['id']}").json()
    assert final["status"] == events[-1][2]["status"] == "completed"
    assert final["response"]["id"] == task["response_id"]
    assert final["response"]["usage"] == events[-1][2]["usage"]
    done = [data["item"] for _, name, data in events if name == "response.output_item.done"]
    assert final["response"]["output"] == done


def test_events_replay_from_1_then_close_after_the_final(client):  # covers: R6.4-1, R7-3
    task = create_task(client, body(SLOW, model=SCRIPTED))
    response, raw = read_task_events(client, task["id"])  # starts while it still runs
    assert response.status_code == 200 and response.headers["content-type"] == "text/event-stream"
    events = parse_events(raw)
    assert [i for i, _, _ in events] == list(range(1, len(events) + 1))
    assert events[0][1] == "response.created" and events[-1][1] == "response.completed"
    assert "".join(d["delta"] for _, n, d in events if n == "response.output_text.delta") == SLOW.split(" ", 2)[2]
    assert all(d["response_id"] == task["response_id"] for _, _, d in events)


def test_resume_after_n_and_after_wins_over_last_event_id(client):  # covers: R6.4-2
    task = create_task(client, body("a b c d e f", model=SCRIPTED))
    _, whole = read_task_events(client, task["id"])
    events = parse_events(whole)
    _, after3 = read_task_events(client, task["id"], after=3)
    assert [i for i, _, _ in parse_events(after3)] == [i for i, _, _ in events if i > 3]
    assert whole.endswith(after3) and after3.startswith(b"id: 4\n")
    _, by_header = read_task_events(client, task["id"], last_event_id=5)
    assert by_header.startswith(b"id: 6\n") and whole.endswith(by_header)
    _, both = read_task_events(client, task["id"], after=2, last_event_id=5)
    assert both.startswith(b"id: 3\n") and whole.endswith(both)


@pytest.mark.parametrize(
    ("query", "header", "param"),
    [
        ("-1", None, "after"),
        ("1.5", None, "after"),
        ("x", "3", "after"),
        (None, "abc", "Last-Event-ID"),
        ("", None, "after"),
        ("1", "abc", "Last-Event-ID"),
    ],
)
def test_invalid_resume_points_are_400(client, query, header, param):  # covers: R6.4-2
    task = create_task(client, body("x", model=SCRIPTED))
    url = f"{TASKS}/{task['id']}/events" + (f"?after={query}" if query is not None else "")
    got = client.get(url, headers={"last-event-id": header} if header is not None else {})
    assert_problem(got, 400, "invalid_request", param)


def test_resuming_after_an_event_not_sent_yet_is_400(client):  # covers: R6.4-2
    task = create_task(client, body("!slow 300 " + " ".join(["w"] * 20), model=SCRIPTED))
    assert_problem(client.get(f"{TASKS}/{task['id']}/events?after=999"), 400, "invalid_request", "after")
    got = client.get(f"{TASKS}/{task['id']}/events", headers={"last-event-id": "999"})
    assert_problem(got, 400, "invalid_request", "Last-Event-ID")
    assert client.post(f"{TASKS}/{task['id']}/cancel").json()["status"] == "cancelled"


def test_resuming_after_the_final_event_is_204(client):  # covers: R7-6
    task = create_task(client, body("short one", model=SCRIPTED))
    _, raw = read_task_events(client, task["id"])
    last = parse_events(raw)[-1][0]
    for params in ({"after": last}, {"last_event_id": last}, {"after": last + 5}):
        response, rest = read_task_events(client, task["id"], **params)
        assert response.status_code == 204 and rest == b""
        assert response.headers["lmsp-version"] == "1.0"
    response, rest = read_task_events(client, task["id"], after=last - 1)
    assert response.status_code == 200 and parse_events(rest)[0][0] == last


def test_cancel_ends_the_task_cancelled_and_a_second_cancel_changes_nothing(client):  # covers: R7-4
    task = create_task(client, body("!slow 200 " + " ".join(["w"] * 50), model=SCRIPTED))
    cancelled = client.post(f"{TASKS}/{task['id']}/cancel")
    assert cancelled.status_code == 200
    got = cancelled.json()
    assert got["status"] == "cancelled" and got["response"]["status"] == "cancelled"
    _, raw = read_task_events(client, task["id"])
    events = parse_events(raw)
    assert events[-1][1] == "response.cancelled"
    again = client.post(f"{TASKS}/{task['id']}/cancel")
    assert again.status_code == 200 and again.json() == got == client.get(f"{TASKS}/{task['id']}").json()
    # a finished task stays what it was
    done = create_task(client, body("finish", model=SCRIPTED))
    finished = wait_final(client, done["id"])
    assert client.post(f"{TASKS}/{done['id']}/cancel").json() == finished
    assert finished["status"] == "completed"


def test_unknown_task_is_404(client):  # covers: R7-7
    missing = "task_01J00000000000000000000000"
    for method, path in (("GET", ""), ("GET", "/events"), ("POST", "/cancel")):
        assert_problem(client.request(method, f"{TASKS}/{missing}{path}"), 404, "task_not_found", "task_id")


def test_a_post_stream_is_not_a_task_and_cannot_be_resumed(client):  # covers: R6.4-4
    _, events = stream(client, body("belongs to its connection", model=SCRIPTED))
    response_id = events[0][2]["response_id"]
    assert_problem(client.get(f"{TASKS}/{response_id}/events", headers={"last-event-id": "1"}), 404, "task_not_found")
    assert_problem(client.get(f"{TASKS}/{response_id}"), 404, "task_not_found")


def test_several_readers_at_once_get_the_same_bytes(server, client):  # covers: R7-3
    task = create_task(client, body(SLOW, model=SCRIPTED))
    got: list[bytes] = []

    def read() -> None:
        with checked_client(server.url) as c:
            got.append(read_task_events(c, task["id"])[1])

    readers = [threading.Thread(target=read) for _ in range(6)]
    for r in readers:
        r.start()
    for r in readers:
        r.join(30)
    assert len(got) == 6 and len(set(got)) == 1
    assert parse_events(got[0])[-1][1] == "response.completed"


def test_a_task_outlives_its_reader(server, client):  # covers: R7-1, R7-3
    task = create_task(client, body(SLOW, model=SCRIPTED))
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(f"GET {TASKS}/{task['id']}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        seen = b""
        while b"response.output_text.delta" not in seen:
            chunk = sock.recv(65536)
            assert chunk
            seen += chunk
    final = wait_final(client, task["id"])
    assert final["status"] == "completed"
    assert final["response"]["output"][0]["content"][0]["text"] == SLOW.split(" ", 2)[2]


# --- retention: a tiny ring and a short time limit ------------------------------------------

RING = 8
RETENTION = 1.0


@pytest.fixture(scope="module")
def short_memory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        tmp_path_factory.mktemp("lmsp-tasks"),
        "--scripted-model", SCRIPTED,
        "--task-events-max", str(RING),
        "--task-retention", str(RETENTION),
    )  # fmt: skip
    yield srv
    srv.stop()


def test_events_dropped_by_the_ring_are_410(short_memory):  # covers: R6.4-3, R7-5
    with checked_client(short_memory.url) as c:
        task = create_task(c, body(" ".join(f"w{i}" for i in range(20)), model=SCRIPTED))
        final = wait_final(c, task["id"])
        gone = assert_problem(c.get(f"{TASKS}/{task['id']}/events"), 410, "event_history_expired")
        assert "GET the task" in gone["detail"]
        # the last RING events are kept: resuming just before them works
        last = 1 + 1 + 20 + 1 + 1  # created, item added, 20 deltas, item done, completed
        _, tail = read_task_events(c, task["id"], after=last - RING)
        events = parse_events(tail)
        assert [i for i, _, _ in events] == list(range(last - RING + 1, last + 1))
        assert events[-1][1] == "response.completed"
        assert_problem(
            c.get(f"{TASKS}/{task['id']}/events", params={"after": last - RING - 1}), 410, "event_history_expired"
        )
        # and the result is still there (R6.4-3: read it with GET)
        assert final["response"]["output"][0]["content"][0]["text"].startswith("w0 w1")


def test_events_expire_some_time_after_the_task_ends(short_memory):  # covers: R6.4-3, R7-5
    import time

    with checked_client(short_memory.url) as c:
        task = create_task(c, body("soon forgotten", model=SCRIPTED))
        final = wait_final(c, task["id"])
        response, raw = read_task_events(c, task["id"])
        assert response.status_code == 200
        last = parse_events(raw)[-1][0]
        time.sleep(RETENTION + 0.5)
        assert_problem(c.get(f"{TASKS}/{task['id']}/events"), 410, "event_history_expired")
        assert_problem(c.get(f"{TASKS}/{task['id']}/events", params={"after": last - 1}), 410, "event_history_expired")
        # the task itself is kept longer, and nothing is left after its final event
        assert c.get(f"{TASKS}/{task['id']}").json() == final
        assert read_task_events(c, task["id"], after=last)[0].status_code == 204
        assert c.post(f"{TASKS}/{task['id']}/cancel").json() == final


RING_BYTES = 2000


@pytest.fixture(scope="module")
def few_bytes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    srv = start_server(
        tmp_path_factory.mktemp("lmsp-bytes"), "--scripted-model", SCRIPTED, "--task-events-bytes", str(RING_BYTES)
    )
    yield srv
    srv.stop()


def test_events_past_the_byte_bound_are_410(few_bytes):  # covers: R6.4-3, R7-5
    with checked_client(few_bytes.url) as c:
        task = create_task(c, body(" ".join(f"w{i}" for i in range(20)), model=SCRIPTED))
        final = wait_final(c, task["id"])
        last = 1 + 1 + 20 + 1 + 1
        assert_problem(c.get(f"{TASKS}/{task['id']}/events"), 410, "event_history_expired")
        kept = [after for after in range(last) if read_task_events(c, task["id"], after=after)[0].status_code == 200]
        assert kept == list(range(kept[0], last)) and kept[0] > 0  # the newest ones, in one piece
        _, oldest_on = read_task_events(c, task["id"], after=kept[0])
        assert len(oldest_on) <= RING_BYTES and parse_events(oldest_on)[-1][0] == last
        assert c.get(f"{TASKS}/{task['id']}").json() == final
