"""A store file from before the byte quota (issue 28) opens with each response's size filled
in, so that the quota counts the responses it already held; one from before task records fell
under DELETE, retention and the quotas (issue 38) gets each record's age, response and size."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from helpers import assert_old_task_records_have_their_bounds
from lmsp.store.sqlite import SqliteStore


def test_an_older_file_gets_its_responses_sizes(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE responses (owner TEXT NOT NULL, id TEXT NOT NULL, created_at INTEGER NOT NULL, "
        "response BLOB NOT NULL, input BLOB NOT NULL, PRIMARY KEY (owner, id)) WITHOUT ROWID"
    )
    for n in range(3):
        response = orjson.dumps({"id": f"resp_{n}", "created_at": n, "output": []})
        old.execute(
            "INSERT INTO responses VALUES ('o', ?, ?, ?, ?)", (f"resp_{n}", n, response, orjson.dumps(["x" * 1000]))
        )
    old.commit()
    old.close()

    store = SqliteStore(path)
    try:
        sizes = [row[0] for row in store._db.execute("SELECT size FROM responses ORDER BY created_at")]
        assert all(size > 1000 for size in sizes)
        assert store.trim_response_bytes("o", sizes[1] + sizes[2]) == 1
        assert store.get_response("o", "resp_0") is None
        assert store.get_response("o", "resp_2") is not None
    finally:
        store.close()


def test_an_older_file_gets_its_task_records_bounds(tmp_path: Path) -> None:
    # Issue 38: task records from before DELETE, retention and quotas reached them are found
    # by their response and age once the file is opened again.
    path = tmp_path / "store.sqlite3"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE tasks (owner TEXT NOT NULL, id TEXT NOT NULL, status TEXT NOT NULL, model TEXT NOT NULL, "
        "last_event_id INTEGER NOT NULL, task BLOB NOT NULL, PRIMARY KEY (owner, id)) WITHOUT ROWID"
    )
    for n in range(3):
        task = orjson.dumps(
            {"id": f"task_{n}", "status": "completed", "created_at": 1_000 + n, "response_id": f"resp_{n}"}
        )
        old.execute("INSERT INTO tasks VALUES ('o', ?, 'completed', 'm', 3, ?)", (f"task_{n}", task))
    old.commit()
    old.close()

    store = SqliteStore(path)
    try:
        assert_old_task_records_have_their_bounds(store)
    finally:
        store.close()
