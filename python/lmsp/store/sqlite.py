"""The embedded store: one SQLite file in WAL mode in the service's data folder.

WAL lets readers go on while a write commits; `synchronous=FULL` makes each commit reach the
disk before `put_response` returns, so a stored response survives a kill -9 and a power cut.
One connection, used by one thread at a time (the StoreWorker's).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson

from .base import IdempotencyRecord, StoredResponse, StoredTask

__all__ = ["SqliteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    response BLOB NOT NULL,
    input BLOB NOT NULL,
    size INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (owner, id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency (
    owner TEXT NOT NULL,
    key TEXT NOT NULL,
    fingerprint BLOB NOT NULL,
    created_at REAL NOT NULL,
    status INTEGER,
    headers BLOB,
    body BLOB,
    PRIMARY KEY (owner, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS idempotency_age ON idempotency (created_at);
CREATE INDEX IF NOT EXISTS responses_age ON responses (created_at);
CREATE TABLE IF NOT EXISTS tasks (
    owner TEXT NOT NULL,
    id TEXT NOT NULL,
    status TEXT NOT NULL,
    model TEXT NOT NULL,
    last_event_id INTEGER NOT NULL,
    task BLOB NOT NULL,
    PRIMARY KEY (owner, id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS tasks_status ON tasks (status);
"""


class SqliteStore:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Autocommit mode: each statement or explicit BEGIN…COMMIT is its own transaction.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        self._add_sizes()
        self._add_task_bounds()
        # A claim still running when the last process ended will never finish: its request
        # died with that process, so a retry must be free to run.
        self._db.execute("DELETE FROM idempotency WHERE status IS NULL")

    def _add_sizes(self) -> None:
        """A file from before the byte quota: each response's size column, filled once, and the
        index the quotas read (the owner's responses in order, with their sizes) instead of
        every row (0.3 s for 10,000 responses of 30 KB; under 1 ms from the index)."""
        db = self._db
        if "size" not in {row[1] for row in db.execute("PRAGMA table_info(responses)")}:
            db.execute("ALTER TABLE responses ADD COLUMN size INTEGER NOT NULL DEFAULT 0")
            db.execute("UPDATE responses SET size = length(response) + length(input)")
        db.execute("CREATE INDEX IF NOT EXISTS responses_owner_size ON responses (owner, created_at, id, size)")

    def _add_task_bounds(self) -> None:
        """Each task record's creation time, response id and size as columns (a file from before
        task records fell under retention, quotas and DELETE: filled once from the JSON), and
        the indexes those read."""
        db = self._db
        columns = {row[1] for row in db.execute("PRAGMA table_info(tasks)")}
        if "response_id" not in columns:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("ALTER TABLE tasks ADD COLUMN created_at INTEGER NOT NULL DEFAULT 0")
                db.execute("ALTER TABLE tasks ADD COLUMN response_id TEXT NOT NULL DEFAULT ''")
                db.execute("ALTER TABLE tasks ADD COLUMN size INTEGER NOT NULL DEFAULT 0")
                # CAST: a BLOB handed to json_extract is read as SQLite's binary JSON (3.45+).
                db.execute(
                    "UPDATE tasks SET created_at = json_extract(CAST(task AS TEXT), '$.created_at'), "
                    "response_id = json_extract(CAST(task AS TEXT), '$.response_id'), size = length(task)"
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        db.execute("CREATE INDEX IF NOT EXISTS tasks_owner_size ON tasks (owner, created_at, id, size)")
        db.execute("CREATE INDEX IF NOT EXISTS tasks_response ON tasks (owner, response_id)")
        db.execute("CREATE INDEX IF NOT EXISTS tasks_age ON tasks (created_at)")

    def put_response(self, owner: str, stored: StoredResponse) -> None:
        response, items = orjson.dumps(stored.response), orjson.dumps(stored.input)
        self._db.execute(
            "INSERT OR REPLACE INTO responses (owner, id, created_at, response, input, size) VALUES (?, ?, ?, ?, ?, ?)",
            (owner, stored.id, stored.response["created_at"], response, items, len(response) + len(items)),
        )

    def get_response(self, owner: str, response_id: str) -> StoredResponse | None:
        row = self._db.execute(
            "SELECT response, input FROM responses WHERE owner = ? AND id = ?", (owner, response_id)
        ).fetchone()
        if row is None:
            return None
        return StoredResponse(response=orjson.loads(row[0]), input=orjson.loads(row[1]))

    def delete_response(self, owner: str, response_id: str) -> bool:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            gone = db.execute("DELETE FROM tasks WHERE owner = ? AND response_id = ?", (owner, response_id)).rowcount
            gone += db.execute(
                "DELETE FROM idempotency WHERE owner = ? AND body IS NOT NULL AND instr(body, ?) > 0",
                (owner, orjson.dumps(response_id)),  # quoted: "resp_1" is not inside "resp_10"
            ).rowcount
            gone += db.execute("DELETE FROM responses WHERE owner = ? AND id = ?", (owner, response_id)).rowcount
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return gone > 0

    def response_tasks(self, owner: str, response_id: str) -> list[str]:
        rows = self._db.execute(
            "SELECT id FROM tasks WHERE owner = ? AND response_id = ? ORDER BY id", (owner, response_id)
        )
        return [str(row[0]) for row in rows.fetchall()]

    def expire_responses(self, before: int) -> int:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            gone = db.execute("DELETE FROM responses WHERE created_at < ?", (before,)).rowcount
            gone += db.execute("DELETE FROM tasks WHERE created_at < ? AND status != 'in_progress'", (before,)).rowcount
            db.execute("DELETE FROM idempotency WHERE created_at < ? AND status IS NOT NULL", (before,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return gone

    def trim_responses(self, owner: str, keep: int) -> int:
        # Newest first by creation, the id breaking ties, so that both stores drop the same ones.
        return self._db.execute(
            "DELETE FROM responses WHERE owner = ? AND id IN (SELECT id FROM responses WHERE owner = ? "
            "ORDER BY created_at DESC, id DESC LIMIT -1 OFFSET ?)",
            (owner, owner, max(0, keep)),
        ).rowcount

    def trim_response_bytes(self, owner: str, max_bytes: int) -> int:
        # A running total, newest first: once past the bound it stays past it, so the rows
        # beyond it are the oldest. The same order and sizes as PostgreSQL's, so both drop the
        # same ones.
        return self._db.execute(
            "DELETE FROM responses WHERE owner = ? AND id IN (SELECT id FROM (SELECT id, "
            "ROW_NUMBER() OVER newest AS n, SUM(size) OVER newest AS total "
            "FROM responses WHERE owner = ? "
            "WINDOW newest AS (ORDER BY created_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) "
            "WHERE n > 1 AND total > ?)",
            (owner, owner, max(0, max_bytes)),
        ).rowcount

    def trim_tasks(self, owner: str, keep: int) -> int:
        # Final records only: a running task's record is how a dead process's task is found.
        return self._db.execute(
            "DELETE FROM tasks WHERE owner = ? AND id IN (SELECT id FROM tasks WHERE owner = ? "
            "AND status != 'in_progress' ORDER BY created_at DESC, id DESC LIMIT -1 OFFSET ?)",
            (owner, owner, max(0, keep)),
        ).rowcount

    def trim_task_bytes(self, owner: str, max_bytes: int) -> int:
        return self._db.execute(
            "DELETE FROM tasks WHERE owner = ? AND id IN (SELECT id FROM (SELECT id, "
            "ROW_NUMBER() OVER newest AS n, SUM(size) OVER newest AS total "
            "FROM tasks WHERE owner = ? AND status != 'in_progress' "
            "WINDOW newest AS (ORDER BY created_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) "
            "WHERE n > 1 AND total > ?)",
            (owner, owner, max(0, max_bytes)),
        ).rowcount

    def claim_key(self, owner: str, key: str, fingerprint: bytes, now: float, ttl: float) -> IdempotencyRecord | None:
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM idempotency WHERE created_at < ?", (now - ttl,))
            row = db.execute(
                "SELECT fingerprint, created_at, status, headers, body FROM idempotency WHERE owner = ? AND key = ?",
                (owner, key),
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO idempotency (owner, key, fingerprint, created_at) VALUES (?, ?, ?, ?)",
                    (owner, key, fingerprint, now),
                )
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        if row is None:
            return None
        headers = tuple((str(k), str(v)) for k, v in orjson.loads(row[3])) if row[3] else ()
        return IdempotencyRecord(
            fingerprint=row[0], created_at=row[1], status=row[2], headers=headers, body=row[4] or b""
        )

    def finish_key(self, owner: str, key: str, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self._db.execute(
            "UPDATE idempotency SET status = ?, headers = ?, body = ? WHERE owner = ? AND key = ?",
            (status, orjson.dumps(headers), body, owner, key),
        )

    def release_key(self, owner: str, key: str) -> None:
        self._db.execute("DELETE FROM idempotency WHERE owner = ? AND key = ? AND status IS NULL", (owner, key))

    def put_task(self, owner: str, stored: StoredTask) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO tasks (owner, id, status, model, last_event_id, task, created_at, response_id, "
            "size) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            stored.row(owner),
        )

    def get_task(self, owner: str, task_id: str) -> StoredTask | None:
        row = self._db.execute(
            "SELECT task, model, last_event_id FROM tasks WHERE owner = ? AND id = ?", (owner, task_id)
        ).fetchone()
        if row is None:
            return None
        return StoredTask(task=orjson.loads(row[0]), model=row[1], last_event_id=row[2])

    def heartbeat(self, now: float) -> None:
        """One process owns the file: its running claims were freed when it opened it."""

    def ping(self) -> None:
        self._db.execute("SELECT 1").fetchone()

    def running_tasks(self) -> list[tuple[str, StoredTask]]:
        """(owner, task) of every task not yet final: at start-up, those a dead process left."""
        rows = self._db.execute("SELECT owner, task, model, last_event_id FROM tasks WHERE status = 'in_progress'")
        return [(r[0], StoredTask(task=orjson.loads(r[1]), model=r[2], last_event_id=r[3])) for r in rows.fetchall()]

    def close(self) -> None:
        self._db.close()
