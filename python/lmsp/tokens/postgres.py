"""The shared tokens: in the PostgreSQL store several replicas share (`--store postgresql://…`),
so that a token created or revoked through any replica's `lmsp token … --store` holds on all of
them at their next request. The table is one of the store's migrations (store/postgres.py)."""

from __future__ import annotations

import builtins  # `list` is a method of the token classes, so the type is spelled in full
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import Connection

from ..protocol.errors import ProblemError
from ..store.postgres import Row, migrate
from .base import ActiveTokens, TokenInfo, digest, new_token, revoke_ident, token_info

__all__ = ["PostgresTokens"]


class PostgresTokens(ActiveTokens):
    """The tokens every replica shares. Checked on the event loop on every request (the guard
    is synchronous), so it has a connection of its own, never waiting behind the store's pool:
    one small query (`token_changes`) per check, the tokens reread only when that moved, so a
    revoke committed anywhere holds from the next request on."""

    def __init__(self, conninfo: str, *, connect_timeout: float = 10.0) -> None:
        super().__init__()
        self._conninfo = conninfo
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()  # the event loop's, or the CLI's; one statement at a time
        self._conn: Connection[Row] | None = None
        self._version: int | None = None
        with self._connection() as conn:
            migrate(conn)

    @contextmanager
    def _connection(self) -> Iterator[Connection[Row]]:
        with self._lock:
            if self._conn is None or self._conn.closed:
                self._conn = psycopg.connect(
                    self._conninfo, autocommit=True, connect_timeout=int(self._connect_timeout)
                )
            try:
                yield self._conn
            except psycopg.OperationalError:
                self._conn.close()  # the next call connects again
                raise

    def create(self, scopes: frozenset[str], name: str | None = None) -> tuple[str, TokenInfo]:
        while True:
            token, record = new_token(scopes, name)
            with self._connection() as conn:
                inserted = conn.execute(
                    "INSERT INTO tokens (id, hash, name, scopes, created_at) VALUES (%s, %s, %s, %s, %s) "
                    "ON CONFLICT (id) DO NOTHING",
                    (record.id, digest(token), name, ",".join(sorted(scopes)), record.created_at),
                ).rowcount
            if inserted:  # else that id was taken (1 in 2^48): draw again
                return token, record

    def list(self) -> list[TokenInfo]:
        with self._connection() as conn:
            rows = conn.execute(
                "SELECT id, name, scopes, created_at, revoked_at FROM tokens ORDER BY created_at, id"
            ).fetchall()
        return [token_info(*row) for row in rows]

    def revoke(self, ident: str) -> builtins.list[TokenInfo]:
        ident = revoke_ident(ident)
        now = int(time.time())
        with self._connection() as conn:
            rows = conn.execute(
                "UPDATE tokens SET revoked_at = %s WHERE revoked_at IS NULL AND (id = %s OR name = %s) "
                "RETURNING id, name, scopes, created_at, revoked_at",
                (now, ident, ident),
            ).fetchall()
        return [token_info(*row) for row in rows]

    def _refresh(self) -> None:
        try:
            with self._connection() as conn:
                row = conn.execute("SELECT version FROM token_changes").fetchone()
                assert row is not None  # the migration's one row
                if row[0] == self._version:
                    return
                rows = conn.execute(
                    "SELECT hash, id, name, scopes, created_at, revoked_at FROM tokens WHERE revoked_at IS NULL"
                ).fetchall()
        except psycopg.Error as exc:
            raise ProblemError("service_unavailable", f"the shared store is unreachable: {exc}") from None
        self._load(rows)
        self._version = row[0]

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
