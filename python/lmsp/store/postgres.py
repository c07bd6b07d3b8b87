"""The shared store: PostgreSQL, for several replicas behind one balancer (`--store postgresql://…`).

The same records and guarantees as the embedded SQLite store: each call is its own
transaction and returns once committed (`synchronous_commit` on, PostgreSQL's default), so a
stored response survives a crash of the replica and of the database. Connections come from a
psycopg_pool pool, shared by the StoreWorker's threads.

Two differences, both because several replicas share it: a claim still running is not swept
at start-up (it may be another replica's live request) but freed once its replica has not been
seen (`heartbeat`) for `stale_after` seconds, and a final task record is never replaced (a
replica that took a dead one's task over and the owner, if it was only slow, cannot both end
it; the first end stands).

The tokens live in the same database (tokens/postgres.py, its tables made by `migrate` here).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

import orjson
import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolTimeout

from ..protocol.errors import unavailable
from .base import IdempotencyRecord, StoredResponse, StoredTask

__all__ = ["CONNECT_TIMEOUT", "STATEMENT_TIMEOUT", "PostgresStore", "Row", "connection_options", "migrate"]

# A row as psycopg returns it: the columns each query names, in that order.
Row = tuple[Any, ...]

# Seconds to open a connection, and the most one statement may run on the server. A database
# that stops answering is noticed by the caller's own deadline (StoreWorker); these bound
# what the server and the network can hold, so that a stalled connection is dropped, not kept.
CONNECT_TIMEOUT = 5.0
STATEMENT_TIMEOUT = 10.0


def connection_options(connect_timeout: float = CONNECT_TIMEOUT) -> dict[str, Any]:
    """psycopg connect() arguments every connection to the shared store gets: a connect
    timeout, a server-side statement timeout, and TCP keepalives with a user timeout so that
    a connection to a host that vanished (a partition, a power cut) fails within seconds
    instead of the kernel's two hours."""
    return {
        "connect_timeout": max(1, int(connect_timeout)),
        "options": f"-c statement_timeout={int(STATEMENT_TIMEOUT * 1000)}",
        "keepalives": 1,
        "keepalives_idle": 5,
        "keepalives_interval": 2,
        "keepalives_count": 3,
        "tcp_user_timeout": 15000,
    }


log = logging.getLogger(__name__)

# pg_advisory_xact_lock's key: replicas starting together apply the migrations once.
_MIGRATION_LOCK = 0x6C6D7370  # "lmsp"


def migrate(conn: Connection[Row]) -> list[str]:
    """Applies the project's SQL files (store/migrations/postgresql, in name order) that this
    database has not seen yet; returns their names."""
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
        conn.execute(
            "CREATE TABLE IF NOT EXISTS lmsp_migrations "
            "(name TEXT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
        )
        done = {row[0] for row in conn.execute("SELECT name FROM lmsp_migrations")}
        # One name per joinpath: Python 3.10 takes no more.
        folder = resources.files(__package__).joinpath("migrations").joinpath("postgresql")
        for file in sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name):
            if file.name in done:
                continue
            conn.execute(file.read_text(encoding="utf-8"))  # our own files, no parameters
            conn.execute("INSERT INTO lmsp_migrations (name) VALUES (%s)", (file.name,))
            applied.append(file.name)
    return applied


class PostgresStore:
    def __init__(
        self,
        conninfo: str,
        *,
        max_connections: int = 4,
        connect_timeout: float = CONNECT_TIMEOUT,
        stale_after: float = 30.0,
    ) -> None:
        self.replica = uuid.uuid4().hex
        self.stale_after = stale_after
        # Since when this replica's heartbeats have come through without a gap: only a replica
        # that has itself been seen for `stale_after` may judge another unseen for as long
        # (after a database stall, every replica's heartbeat is equally late).
        self._beating_since = time.monotonic()
        self._last_beat = time.monotonic()
        self._pool: ConnectionPool[Connection[Row]] = ConnectionPool(
            conninfo,
            min_size=1,
            max_size=max_connections,
            kwargs={"autocommit": True, **connection_options(connect_timeout)},
            timeout=STATEMENT_TIMEOUT,
            open=False,
            name="lmsp-store",
        )
        self._pool.open(wait=True, timeout=connect_timeout)
        try:
            with self._pool.connection() as conn:
                migrate(conn)
                self._beat(conn, time.time())
        except BaseException:
            self._pool.close()
            raise

    @contextmanager
    def _connection(self) -> Iterator[Connection[Row]]:
        """A pooled connection; the database away is 503 to whoever asked (its address is
        logged, never sent: a problem document names no host, port, user or database)."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            log.warning("the shared store: %s", exc)
            raise unavailable("the shared store") from None

    def put_response(self, owner: str, stored: StoredResponse) -> None:
        with self._connection() as conn:
            response, items = orjson.dumps(stored.response), orjson.dumps(stored.input)
            conn.execute(
                "INSERT INTO responses (owner, id, created_at, response, input, size) VALUES (%s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (owner, id) DO UPDATE SET created_at = EXCLUDED.created_at, response = EXCLUDED.response, "
                "input = EXCLUDED.input, size = EXCLUDED.size",
                (owner, stored.id, stored.response["created_at"], response, items, len(response) + len(items)),
            )

    def get_response(self, owner: str, response_id: str) -> StoredResponse | None:
        with self._connection() as conn:
            row = conn.execute(
                "SELECT response, input FROM responses WHERE owner = %s AND id = %s", (owner, response_id)
            ).fetchone()
        if row is None:
            return None
        return StoredResponse(response=orjson.loads(row[0]), input=orjson.loads(row[1]))

    def delete_response(self, owner: str, response_id: str) -> bool:
        with self._connection() as conn, conn.transaction():
            gone = conn.execute(
                "DELETE FROM tasks WHERE owner = %s AND response_id = %s", (owner, response_id)
            ).rowcount
            gone += conn.execute(
                "DELETE FROM idempotency WHERE owner = %s AND body IS NOT NULL AND position(%s::bytea in body) > 0",
                (owner, orjson.dumps(response_id)),  # quoted: "resp_1" is not inside "resp_10"
            ).rowcount
            gone += conn.execute("DELETE FROM responses WHERE owner = %s AND id = %s", (owner, response_id)).rowcount
        return gone > 0

    def response_tasks(self, owner: str, response_id: str) -> list[str]:
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT id FROM tasks WHERE owner = %s AND response_id = %s ORDER BY id", (owner, response_id)
            ).fetchall()
        return [str(row[0]) for row in rows]

    def expire_responses(self, before: int) -> int:
        with self._connection() as conn, conn.transaction():
            gone = conn.execute("DELETE FROM responses WHERE created_at < %s", (before,)).rowcount
            gone += conn.execute(
                "DELETE FROM tasks WHERE created_at < %s AND status != 'in_progress'", (before,)
            ).rowcount
            conn.execute("DELETE FROM idempotency WHERE created_at < %s AND status IS NOT NULL", (before,))
        return gone

    def trim_responses(self, owner: str, keep: int) -> int:
        # Newest first by creation, the id breaking ties, so that both stores drop the same ones.
        with self._connection() as conn:
            return conn.execute(
                "DELETE FROM responses WHERE owner = %s AND id IN (SELECT id FROM responses WHERE owner = %s "
                "ORDER BY created_at DESC, id DESC OFFSET %s)",
                (owner, owner, max(0, keep)),
            ).rowcount

    def trim_response_bytes(self, owner: str, max_bytes: int) -> int:
        # As SQLite's: a running total newest first, of the sizes kept beside each response
        # (JSON bytes, as SQLite counts them), read from the index (migration 0006).
        with self._connection() as conn:
            return conn.execute(
                "DELETE FROM responses WHERE owner = %s AND id IN (SELECT id FROM (SELECT id, "
                "ROW_NUMBER() OVER newest AS n, SUM(size) OVER newest AS total "
                "FROM responses WHERE owner = %s "
                "WINDOW newest AS (ORDER BY created_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) AS sized "
                "WHERE n > 1 AND total > %s)",
                (owner, owner, max(0, max_bytes)),
            ).rowcount

    def trim_tasks(self, owner: str, keep: int) -> int:
        # Final records only, as SQLite's: a running one is how a dead replica's task is found.
        with self._connection() as conn:
            return conn.execute(
                "DELETE FROM tasks WHERE owner = %s AND id IN (SELECT id FROM tasks WHERE owner = %s "
                "AND status != 'in_progress' ORDER BY created_at DESC, id DESC OFFSET %s)",
                (owner, owner, max(0, keep)),
            ).rowcount

    def trim_task_bytes(self, owner: str, max_bytes: int) -> int:
        with self._connection() as conn:
            return conn.execute(
                "DELETE FROM tasks WHERE owner = %s AND id IN (SELECT id FROM (SELECT id, "
                "ROW_NUMBER() OVER newest AS n, SUM(size) OVER newest AS total "
                "FROM tasks WHERE owner = %s AND status != 'in_progress' "
                "WINDOW newest AS (ORDER BY created_at DESC, id DESC ROWS UNBOUNDED PRECEDING)) AS sized "
                "WHERE n > 1 AND total > %s)",
                (owner, owner, max(0, max_bytes)),
            ).rowcount

    def claim_key(self, owner: str, key: str, fingerprint: bytes, now: float, ttl: float) -> IdempotencyRecord | None:
        with self._connection() as conn, conn.transaction():
            conn.execute("DELETE FROM idempotency WHERE created_at < %s", (now - ttl,))
            # Two replicas claiming one key at once: the primary key lets exactly one insert.
            claimed = conn.execute(
                "INSERT INTO idempotency (owner, key, fingerprint, created_at, holder) VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT DO NOTHING",
                (owner, key, fingerprint, now, self.replica),
            ).rowcount
            if claimed:
                return None
            row = conn.execute(
                "SELECT i.fingerprint, i.created_at, i.status, i.headers, i.body, i.holder, r.seen_at "
                "FROM idempotency i LEFT JOIN replicas r ON r.id = i.holder "
                "WHERE i.owner = %s AND i.key = %s FOR UPDATE OF i",
                (owner, key),
            ).fetchone()
            assert row is not None  # the row that holds the key: committed, so this statement sees it
            holder, seen_at = row[5], row[6]
            abandoned = (
                holder is not None
                and holder != self.replica
                and (seen_at is None or seen_at < now - self.stale_after)
                and time.monotonic() - self._beating_since >= self.stale_after
            )
            if row[2] is None and abandoned and bytes(row[0]) == fingerprint:
                # Its replica died with the request: the retry runs it.
                conn.execute(
                    "UPDATE idempotency SET created_at = %s, holder = %s WHERE owner = %s AND key = %s",
                    (now, self.replica, owner, key),
                )
                return None
        headers = tuple((str(k), str(v)) for k, v in orjson.loads(row[3])) if row[3] else ()
        return IdempotencyRecord(
            fingerprint=bytes(row[0]), created_at=row[1], status=row[2], headers=headers, body=bytes(row[4] or b"")
        )

    def finish_key(self, owner: str, key: str, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        # Fenced by the holder: a replica whose claim was taken over (it looked dead) does not
        # overwrite the answer of the one that ran the retry.
        with self._connection() as conn:
            conn.execute(
                "UPDATE idempotency SET status = %s, headers = %s, body = %s "
                "WHERE owner = %s AND key = %s AND holder = %s AND status IS NULL",
                (status, orjson.dumps(headers), body, owner, key, self.replica),
            )

    def heartbeat(self, now: float) -> None:
        """This replica is alive (its running claims are its own)."""
        with self._connection() as conn:
            self._beat(conn, now)
        # Measured between heartbeats that came through: one that hung while the database
        # stalled ends a gap as long as the stall.
        beat = time.monotonic()
        if beat - self._last_beat > self.stale_after / 2:  # a gap: this replica was unseen too
            self._beating_since = beat
        self._last_beat = beat

    def _beat(self, conn: Connection[Row], now: float) -> None:
        conn.execute(
            "INSERT INTO replicas (id, seen_at) VALUES (%s, %s) "
            "ON CONFLICT (id) DO UPDATE SET seen_at = EXCLUDED.seen_at",
            (self.replica, now),
        )
        conn.execute("DELETE FROM replicas WHERE seen_at < %s", (now - 86400,))

    def release_key(self, owner: str, key: str) -> None:
        with self._connection() as conn:
            conn.execute(
                "DELETE FROM idempotency WHERE owner = %s AND key = %s AND status IS NULL AND holder = %s",
                (owner, key, self.replica),
            )

    def put_task(self, owner: str, stored: StoredTask) -> None:
        with self._connection() as conn:
            conn.execute(
                "INSERT INTO tasks (owner, id, status, model, last_event_id, task, created_at, response_id, size) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                "ON CONFLICT (owner, id) DO UPDATE SET status = EXCLUDED.status, model = EXCLUDED.model, "
                "last_event_id = EXCLUDED.last_event_id, task = EXCLUDED.task, created_at = EXCLUDED.created_at, "
                "response_id = EXCLUDED.response_id, size = EXCLUDED.size WHERE tasks.status = 'in_progress'",
                stored.row(owner),
            )

    def get_task(self, owner: str, task_id: str) -> StoredTask | None:
        with self._connection() as conn:
            row = conn.execute(
                "SELECT task, model, last_event_id FROM tasks WHERE owner = %s AND id = %s", (owner, task_id)
            ).fetchone()
        if row is None:
            return None
        return StoredTask(task=orjson.loads(row[0]), model=row[1], last_event_id=row[2])

    def ping(self) -> None:
        # Not through `_connection`: the probe logs a change, not every failed try.
        with self._pool.connection() as conn:
            conn.execute("SELECT 1")

    def running_tasks(self) -> list[tuple[str, StoredTask]]:
        """(owner, task) of every task not yet final, whichever replica runs it."""
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT owner, task, model, last_event_id FROM tasks WHERE status = 'in_progress'"
            ).fetchall()
        return [(r[0], StoredTask(task=orjson.loads(r[1]), model=r[2], last_event_id=r[3])) for r in rows]

    def close(self) -> None:
        self._pool.close()
