"""A PostgreSQL store made before task records fell under DELETE, retention and the quotas
(issue 38; migration 0007): its task records get their creation time, response id and size from
their JSON, so that a DELETE, the sweep and the quotas find the records it already held."""

from __future__ import annotations

import uuid
from importlib import resources

import orjson
import psycopg

from helpers import assert_old_task_records_have_their_bounds
from lmsp.store.postgres import PostgresStore
from lmsp.testing_servers import new_database


def test_task_records_from_before_migration_7_are_found_by_response_and_age(postgres_url: str) -> None:
    url = new_database(postgres_url, f"upgrade_{uuid.uuid4().hex}")
    folder = resources.files("lmsp.store").joinpath("migrations").joinpath("postgresql")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE lmsp_migrations (name TEXT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        for file in sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name):
            if file.name >= "0007":
                break
            conn.execute(file.read_text(encoding="utf-8"))
            conn.execute("INSERT INTO lmsp_migrations (name) VALUES (%s)", (file.name,))
        for n in range(3):
            task = orjson.dumps(
                {"id": f"task_{n}", "status": "completed", "created_at": 1_000 + n, "response_id": f"resp_{n}"}
            )
            conn.execute(
                "INSERT INTO tasks (owner, id, status, model, last_event_id, task) "
                "VALUES ('o', %s, 'completed', 'm', 3, %s)",
                (f"task_{n}", task),
            )
    store = PostgresStore(url)
    try:
        assert_old_task_records_have_their_bounds(store)
    finally:
        store.close()
