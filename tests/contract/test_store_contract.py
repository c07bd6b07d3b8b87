"""The store's contract (lmsp/store/base.py `Store`): stored responses and task records, on
every store backend. Through the interface only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from lmsp.store import Store, StoredResponse, StoredTask

ALICE = "token:alice001"
BOB = "token:bob00001"


def _response(response_id: str, text: str = "hello", created_at: int = 1_700_000_000) -> StoredResponse:
    response = {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "completed",
        "model": "scripted:test",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
    }
    items = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi ✓"}]}]
    return StoredResponse(response=response, input=items)


def _task(
    task_id: str, status: str = "in_progress", last_event_id: int = 0, created_at: int = 1_700_000_000, text: str = ""
) -> StoredTask:
    response: dict[str, Any] | None = None
    if status != "in_progress":
        output = [{"type": "message", "content": [{"type": "output_text", "text": text}]}] if text else []
        response = {"id": f"resp_{task_id}", "object": "response", "status": status, "output": output}
    task = {
        "id": task_id,
        "object": "task",
        "status": status,
        "created_at": created_at,
        "response_id": f"resp_{task_id}",
        "response": response,
    }
    return StoredTask(task=task, model="scripted:test", last_event_id=last_event_id)


# --- stored responses ------------------------------------------------------------------------


def test_a_response_put_is_got_back_whole(store: Store) -> None:
    stored = _response("resp_1")
    store.put_response(ALICE, stored)
    assert store.get_response(ALICE, "resp_1") == stored


def test_an_unknown_response_is_none(store: Store) -> None:
    assert store.get_response(ALICE, "resp_nothing") is None


def test_responses_belong_to_their_owner(store: Store) -> None:
    store.put_response(ALICE, _response("resp_1"))
    assert store.get_response(BOB, "resp_1") is None
    assert store.delete_response(BOB, "resp_1") is False
    assert store.get_response(ALICE, "resp_1") is not None


def test_the_same_id_for_two_owners_is_two_responses(store: Store) -> None:
    store.put_response(ALICE, _response("resp_1", "alice's"))
    store.put_response(BOB, _response("resp_1", "bob's"))
    assert store.get_response(ALICE, "resp_1") == _response("resp_1", "alice's")
    assert store.get_response(BOB, "resp_1") == _response("resp_1", "bob's")


def test_putting_a_response_again_replaces_it(store: Store) -> None:
    store.put_response(ALICE, _response("resp_1", "first"))
    store.put_response(ALICE, _response("resp_1", "second", created_at=1_700_000_001))
    assert store.get_response(ALICE, "resp_1") == _response("resp_1", "second", created_at=1_700_000_001)


def test_delete_forgets_a_response_once(store: Store) -> None:
    store.put_response(ALICE, _response("resp_1"))
    store.put_response(ALICE, _response("resp_2"))
    assert store.delete_response(ALICE, "resp_1") is True
    assert store.get_response(ALICE, "resp_1") is None
    assert store.delete_response(ALICE, "resp_1") is False
    assert store.get_response(ALICE, "resp_2") is not None  # only that one


def test_a_response_put_outlives_the_store_being_closed(open_store: Callable[[], Store], store: Store) -> None:
    store.put_response(ALICE, _response("resp_1"))
    store.close()
    assert open_store().get_response(ALICE, "resp_1") == _response("resp_1")


def test_another_opening_of_the_store_sees_a_response_at_once(open_store: Callable[[], Store], store: Store) -> None:
    other = open_store()  # another replica (PostgreSQL), or the next process (SQLite)
    store.put_response(ALICE, _response("resp_1"))
    assert other.get_response(ALICE, "resp_1") == _response("resp_1")
    assert other.delete_response(ALICE, "resp_1") is True
    assert store.get_response(ALICE, "resp_1") is None


# --- task records --------------------------------------------------------------------------


def test_a_task_put_is_got_back_whole(store: Store) -> None:
    stored = _task("task_1")
    store.put_task(ALICE, stored)
    assert store.get_task(ALICE, "task_1") == stored


def test_an_unknown_task_is_none_and_tasks_belong_to_their_owner(store: Store) -> None:
    store.put_task(ALICE, _task("task_1"))
    assert store.get_task(ALICE, "task_nothing") is None
    assert store.get_task(BOB, "task_1") is None


def test_a_running_task_record_is_replaced_by_its_final_one(store: Store) -> None:
    store.put_task(ALICE, _task("task_1"))
    final = _task("task_1", "completed", last_event_id=12)
    store.put_task(ALICE, final)
    assert store.get_task(ALICE, "task_1") == final


def test_running_tasks_are_those_not_final_of_every_owner(store: Store) -> None:
    assert store.running_tasks() == []
    store.put_task(ALICE, _task("task_1"))
    store.put_task(BOB, _task("task_2"))
    store.put_task(ALICE, _task("task_3"))
    store.put_task(ALICE, _task("task_3", "failed", last_event_id=3))
    store.put_task(BOB, _task("task_4", "completed", last_event_id=9))
    running = sorted(store.running_tasks(), key=lambda pair: pair[1].id)
    assert running == [(ALICE, _task("task_1")), (BOB, _task("task_2"))]


def test_a_task_record_outlives_the_store_being_closed(open_store: Callable[[], Store], store: Store) -> None:
    store.put_task(ALICE, _task("task_1"))
    store.close()
    reopened = open_store()
    assert reopened.get_task(ALICE, "task_1") == _task("task_1")
    assert reopened.running_tasks() == [(ALICE, _task("task_1"))]


def test_heartbeat_is_accepted_at_any_time(store: Store) -> None:
    # It keeps this process's claims its own where a store is shared; where it is not, it
    # has nothing to do. Either way it answers.
    store.heartbeat(1_700_000_000.0)
    store.heartbeat(1_700_000_100.0)


# --- retention and quota (issue 28) ----------------------------------------------------------


def test_expire_forgets_every_owners_responses_older_than_the_cut(store: Store) -> None:
    store.put_response(ALICE, _response("resp_old", created_at=1_000))
    store.put_response(BOB, _response("resp_old", created_at=1_999))
    store.put_response(ALICE, _response("resp_new", created_at=2_000))
    assert store.expire_responses(2_000) == 2
    assert store.get_response(ALICE, "resp_old") is None
    assert store.get_response(BOB, "resp_old") is None
    assert store.get_response(ALICE, "resp_new") is not None  # created at the cut: kept
    assert store.expire_responses(2_000) == 0


def test_trim_keeps_the_owners_newest_and_touches_no_one_else(store: Store) -> None:
    for n in range(5):
        store.put_response(ALICE, _response(f"resp_{n}", created_at=1_000 + n))
    store.put_response(BOB, _response("resp_0", created_at=1))
    assert store.trim_responses(ALICE, 3) == 2
    assert [store.get_response(ALICE, f"resp_{n}") is not None for n in range(5)] == [False, False, True, True, True]
    assert store.get_response(BOB, "resp_0") is not None
    assert store.trim_responses(ALICE, 3) == 0
    assert store.trim_responses(ALICE, 0) == 3


def _replay(store: Store, owner: str, key: str, body: bytes) -> None:
    assert store.claim_key(owner, key, b"print", 1_000.0, 60.0) is None
    store.finish_key(owner, key, 200, [("content-type", "application/json")], body)


def test_delete_forgets_every_copy_of_the_response_at_once(store: Store) -> None:
    # Issue 38: the response, its task records and its replay bodies go in one call.
    store.put_response(ALICE, _response("resp_task_1"))
    store.put_task(ALICE, _task("task_1", "completed", last_event_id=5))  # carries resp_task_1
    store.put_task(ALICE, _task("task_2", "completed", last_event_id=5))
    store.put_task(BOB, _task("task_1", "completed", last_event_id=5))
    for owner in (ALICE, BOB):
        _replay(store, owner, "k1", b'{"id":"resp_task_1"}')
    _replay(store, ALICE, "k2", b'{"id":"resp_task_2"}')

    assert store.response_tasks(ALICE, "resp_task_1") == ["task_1"]
    assert store.delete_response(ALICE, "resp_task_1") is True
    assert store.get_response(ALICE, "resp_task_1") is None
    assert store.get_task(ALICE, "task_1") is None
    assert store.response_tasks(ALICE, "resp_task_1") == []
    assert store.claim_key(ALICE, "k1", b"print", 1_001.0, 60.0) is None  # free again: its body is gone
    # Only that response's, and only the owner's.
    assert store.get_task(ALICE, "task_2") is not None
    kept = store.claim_key(ALICE, "k2", b"print", 1_001.0, 60.0)
    assert kept is not None and kept.body == b'{"id":"resp_task_2"}'
    assert store.get_task(BOB, "task_1") is not None
    bobs = store.claim_key(BOB, "k1", b"print", 1_001.0, 60.0)
    assert bobs is not None and bobs.body == b'{"id":"resp_task_1"}'
    assert store.delete_response(ALICE, "resp_task_1") is False


def test_delete_forgets_a_task_record_whose_response_was_not_stored(store: Store) -> None:
    # A `store: false` background response lives in its task record alone: DELETE reaches it.
    store.put_task(ALICE, _task("task_1", "completed", last_event_id=5))
    assert store.delete_response(ALICE, "resp_task_1") is True
    assert store.get_task(ALICE, "task_1") is None
    assert store.delete_response(ALICE, "resp_task_1") is False


def test_response_tasks_names_each_record_that_carries_it_running_or_final(store: Store) -> None:
    store.put_task(ALICE, _task("task_1"))
    assert store.response_tasks(ALICE, "resp_task_1") == ["task_1"]
    store.put_task(ALICE, _task("task_1", "completed", last_event_id=3))
    assert store.response_tasks(ALICE, "resp_task_1") == ["task_1"]
    assert store.response_tasks(BOB, "resp_task_1") == []
    assert store.response_tasks(ALICE, "resp_task_10") == []


def test_expire_forgets_final_task_records_and_replays_older_than_the_cut(store: Store) -> None:
    store.put_task(ALICE, _task("task_old", "completed", last_event_id=2, created_at=1_000))
    store.put_task(BOB, _task("task_running", created_at=1_000))  # a dead process's: the sweep ends it
    store.put_task(ALICE, _task("task_new", "completed", last_event_id=2, created_at=2_000))
    assert store.claim_key(ALICE, "old", b"print", 1_500.0, 1e9) is None
    store.finish_key(ALICE, "old", 200, [], b'{"id":"resp_task_old"}')
    assert store.expire_responses(2_000) == 1
    assert store.get_task(ALICE, "task_old") is None
    assert store.get_task(BOB, "task_running") is not None
    assert store.get_task(ALICE, "task_new") is not None
    assert store.claim_key(ALICE, "old", b"print", 2_001.0, 1e9) is None  # its replay went with it


def test_trim_tasks_keeps_the_owners_newest_final_records(store: Store) -> None:
    for n in range(4):
        store.put_task(ALICE, _task(f"task_{n}", "completed", last_event_id=2, created_at=1_000 + n))
    store.put_task(ALICE, _task("task_running", created_at=1))  # never counted, never trimmed
    store.put_task(BOB, _task("task_0", "completed", last_event_id=2, created_at=1))
    assert store.trim_tasks(ALICE, 2) == 2
    assert [store.get_task(ALICE, f"task_{n}") is not None for n in range(4)] == [False, False, True, True]
    assert store.get_task(ALICE, "task_running") is not None
    assert store.get_task(BOB, "task_0") is not None
    assert store.trim_tasks(ALICE, 2) == 0


def test_trim_task_bytes_keeps_the_owners_newest_that_fit(store: Store) -> None:
    tasks = [_task(f"task_{n}", "completed", last_event_id=2, created_at=1_000 + n, text="x" * 500) for n in range(3)]
    for stored in tasks:
        store.put_task(ALICE, stored)
    store.put_task(BOB, _task("task_0", "completed", last_event_id=2, created_at=1, text="y" * 5_000))
    sizes = [len(orjson.dumps(stored.task)) for stored in tasks]
    assert store.trim_task_bytes(ALICE, sizes[1] + sizes[2]) == 1
    assert [store.get_task(ALICE, f"task_{n}") is not None for n in range(3)] == [False, True, True]
    assert store.trim_task_bytes(ALICE, 1) == 1  # the newest stays, even alone past the bound
    assert store.get_task(ALICE, "task_2") is not None
    assert store.get_task(BOB, "task_0") is not None


def _size(stored: StoredResponse) -> int:
    """A response's size as the byte quota counts it: its JSON, as kept."""
    return len(orjson.dumps(stored.response)) + len(orjson.dumps(stored.input))


def test_trim_bytes_keeps_the_owners_newest_that_fit_and_touches_no_one_else(store: Store) -> None:
    responses = [_response(f"resp_{n}", "x" * (100 * (n + 1)), created_at=1_000 + n) for n in range(5)]
    for stored in responses:
        store.put_response(ALICE, stored)
    store.put_response(BOB, _response("resp_0", "y" * 5_000, created_at=1))
    sizes = [_size(stored) for stored in responses]
    # Room for the three newest and not a byte more: the two oldest go.
    assert store.trim_response_bytes(ALICE, sum(sizes[2:])) == 2
    assert [store.get_response(ALICE, f"resp_{n}") is not None for n in range(5)] == [False, False, True, True, True]
    assert store.get_response(BOB, "resp_0") is not None
    assert store.trim_response_bytes(ALICE, sum(sizes[2:])) == 0
    # One byte short of the three: the oldest of them goes too.
    assert store.trim_response_bytes(ALICE, sum(sizes[2:]) - 1) == 1
    assert store.get_response(ALICE, "resp_2") is None


def test_trim_bytes_keeps_the_newest_even_past_the_bound(store: Store) -> None:
    # A response larger than the whole bound is the one a continuation needs next: it stays,
    # alone (its size was already bounded by the request's own limits).
    store.put_response(ALICE, _response("resp_old", created_at=1_000))
    store.put_response(ALICE, _response("resp_big", "z" * 10_000, created_at=1_001))
    assert store.trim_response_bytes(ALICE, 1) == 1
    assert store.get_response(ALICE, "resp_big") is not None
    assert store.get_response(ALICE, "resp_old") is None
    assert store.trim_response_bytes(ALICE, 0) == 0


def test_trim_bytes_orders_by_creation_then_id_as_trim_does(store: Store) -> None:
    # Same created_at (whole seconds): the id breaks the tie, on every backend alike.
    for name in ("resp_a", "resp_b", "resp_c"):
        store.put_response(ALICE, _response(name, created_at=1_000))
    assert store.trim_response_bytes(ALICE, 2 * _size(_response("resp_a", created_at=1_000))) == 1
    assert store.get_response(ALICE, "resp_a") is None
    assert store.get_response(ALICE, "resp_c") is not None
