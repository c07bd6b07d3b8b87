"""The shared tokens: in the PostgreSQL store several replicas share (`--store postgresql://…`),
so that a token created or revoked through any replica's `lmsp token … --store` holds on all of
them. The table is one of the store's migrations (store/postgres.py).

A request is authenticated from the active tokens held in memory, never with a round trip to
the database: a thread of the replica's own LISTENs on `lmsp_tokens` (announced by a trigger
at every commit that changes the table) and rereads them when told, and polls the table's
version every `POLL_S` in case a notification was lost with its connection. A change made
anywhere holds on every replica within milliseconds (at most `POLL_S`). While the database is
away the snapshot goes on serving, for at most `STALE_AFTER_S` since it was last known to be
current; past that the replica fails closed: requests that need a token get 503
service_unavailable with Retry-After until it can read the tokens again."""

from __future__ import annotations

import builtins  # `list` is a method of the token classes, so the type is spelled in full
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import psycopg
from psycopg import Connection

from ..protocol.errors import ProblemError
from ..store.postgres import Row, connection_options, migrate
from .base import (
    NO_QUOTA,
    TOKEN_COLUMNS,
    ActiveTokens,
    Quota,
    TokenInfo,
    TokenUsage,
    digest,
    new_token,
    quota_changes,
    revoke_ident,
    token_info,
)

__all__ = ["POLL_S", "STALE_AFTER_S", "PostgresTokens"]

log = logging.getLogger(__name__)

_CHANNEL = "lmsp_tokens"
# How often the watcher checks the table's version without being told; how old the snapshot
# may grow (the database unreachable all that while) before requests are refused.
POLL_S = 5.0
STALE_AFTER_S = 60.0
_RETRY_S = (0.2, 5.0)  # the watcher's backoff while the database is away: first, longest
_ADD_USAGE = (
    "INSERT INTO token_usage AS u (id, requests, input_tokens, output_tokens, limited) VALUES (%s, %s, %s, %s, %s) "
    "ON CONFLICT (id) DO UPDATE SET requests = u.requests + excluded.requests, "
    "input_tokens = u.input_tokens + excluded.input_tokens, output_tokens = u.output_tokens + excluded.output_tokens, "
    "limited = u.limited + excluded.limited"
)


class PostgresTokens(ActiveTokens):
    """The tokens every replica shares, authenticated from memory (see the module's notes).
    The CLI's calls (create, list, revoke) use a connection of their own; the watcher starts
    at the first `any_active` or `authenticate`, which only a serving process makes."""

    def __init__(
        self,
        conninfo: str,
        *,
        connect_timeout: float = 10.0,
        poll: float = POLL_S,
        stale_after: float = STALE_AFTER_S,
    ) -> None:
        super().__init__()
        self._conninfo = conninfo
        self._options = connection_options(connect_timeout)
        self._poll = poll
        self._stale_after = stale_after
        self._lock = threading.Lock()  # the CLI's connection; one statement at a time
        self._reloading = threading.Lock()  # the watcher's reload and one after a change here
        self._conn: Connection[Row] | None = None
        self._version: int | None = None
        self._current_at = 0.0  # monotonic time the snapshot was last known to be current
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        with self._connection() as conn:
            migrate(conn)
            self._reload(conn)

    @contextmanager
    def _connection(self) -> Iterator[Connection[Row]]:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(self._conninfo, autocommit=True, **self._options)
            try:
                yield self._conn
            except psycopg.OperationalError:
                self._conn.close()  # the next call connects again
                raise

    def _reload(self, conn: Connection[Row]) -> None:
        """Reads the version, and the tokens when it moved (one transaction: the version read
        is the one the tokens are at)."""
        checked_at = time.monotonic()
        with self._reloading, conn.transaction():
            row = conn.execute("SELECT version FROM token_changes").fetchone()
            assert row is not None  # the migration's one row
            if row[0] != self._version:
                rows = conn.execute(f"SELECT hash, {TOKEN_COLUMNS} FROM tokens WHERE revoked_at IS NULL").fetchall()
                self._load(rows)
                self._version = row[0]
        self._current_at = checked_at

    def create(self, scopes: frozenset[str], name: str | None = None, quota: Quota = NO_QUOTA) -> tuple[str, TokenInfo]:
        while True:
            token, record = new_token(scopes, name, quota)
            with self._connection() as conn:
                inserted = conn.execute(
                    "INSERT INTO tokens (id, hash, name, scopes, created_at, rpm, tpm, streams) "
                    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (id) DO NOTHING",
                    (
                        record.id,
                        digest(token),
                        name,
                        ",".join(sorted(scopes)),
                        record.created_at,
                        quota.rpm,
                        quota.tpm,
                        quota.streams,
                    ),
                ).rowcount
                if inserted:  # else that id was taken (1 in 2^48): draw again
                    self._reload(conn)  # this opening sees its own change at once
                    return token, record

    def list(self) -> list[TokenInfo]:
        with self._connection() as conn:
            rows = conn.execute(f"SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id").fetchall()
        return [token_info(*row) for row in rows]

    def revoke(self, ident: str) -> builtins.list[TokenInfo]:
        ident = revoke_ident(ident)
        now = int(time.time())
        with self._connection() as conn:
            rows = conn.execute(
                "UPDATE tokens SET revoked_at = %s WHERE revoked_at IS NULL AND (id = %s OR name = %s) "
                f"RETURNING {TOKEN_COLUMNS}",
                (now, ident, ident),
            ).fetchall()
            self._reload(conn)
        return [token_info(*row) for row in rows]

    def set_quota(self, ident: str, changes: Mapping[str, int | None]) -> builtins.list[TokenInfo]:
        assignments, values = quota_changes(changes, "%s")
        ident = revoke_ident(ident)
        with self._connection() as conn:
            rows = conn.execute(
                f"UPDATE tokens SET {assignments} "
                f"WHERE revoked_at IS NULL AND (id = %s OR name = %s) RETURNING {TOKEN_COLUMNS}",
                (*values, ident, ident),
            ).fetchall()
            self._reload(conn)
        return [token_info(*row) for row in rows]

    def usage(self) -> dict[str, TokenUsage]:
        with self._connection() as conn:
            rows = conn.execute("SELECT id, requests, input_tokens, output_tokens, limited FROM token_usage").fetchall()
        return {row[0]: TokenUsage(*row[1:]) for row in rows}

    def add_usage(self, used: Mapping[str, TokenUsage]) -> None:
        with self._connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.executemany(
                _ADD_USAGE,
                [(ident, u.requests, u.input_tokens, u.output_tokens, u.limited) for ident, u in used.items()],
            )

    def _refresh(self) -> None:
        """No database round trip: the snapshot answers, unless it is too old to trust."""
        if self._watcher is None:
            self._start_watching()
        age = time.monotonic() - self._current_at
        if age > self._stale_after:
            raise ProblemError(
                "service_unavailable",
                f"the tokens could not be checked against the shared store for {int(age)} s; try again shortly",
                headers=[("retry-after", "5")],
            )

    def _start_watching(self) -> None:
        with self._lock:
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="lmsp-tokens", daemon=True)
                self._watcher.start()

    def _watch(self) -> None:
        """LISTEN on a connection of its own; reread at each notification and each poll. A
        lost connection is opened again with backoff; the snapshot serves meanwhile."""
        delay = _RETRY_S[0]
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._conninfo, autocommit=True, **self._options) as conn:
                    conn.execute(f"LISTEN {_CHANNEL}")
                    self._reload(conn)  # what changed while it was not listening
                    delay = _RETRY_S[0]
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=self._poll, stop_after=1):
                            pass
                        self._reload(conn)
            except psycopg.Error as exc:
                if self._stop.is_set():
                    return
                log.warning("tokens: the shared store is unreachable (%s); again in %.1f s", exc, delay)
                self._stop.wait(delay)
                delay = min(delay * 2, _RETRY_S[1])

    def close(self) -> None:
        self._stop.set()  # the watcher sees it within POLL_S; it is a daemon thread
        with self._lock:
            if self._conn is not None:
                self._conn.close()
