"""The embedded tokens: `tokens.sqlite3` in the data folder, next to the embedded store."""

from __future__ import annotations

import builtins  # `list` is a method of the token classes, so the type is spelled in full
import os
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from .base import (
    NO_QUOTA,
    QUOTA_FIELDS,
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

__all__ = ["TOKENS_FILE", "TokenStore"]

TOKENS_FILE = "tokens.sqlite3"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id TEXT PRIMARY KEY,
    hash BLOB NOT NULL,
    name TEXT,
    scopes TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
-- What each token has used, added to by the serving process every few seconds: a table of its
-- own, so that counting is no change to the tokens themselves.
CREATE TABLE IF NOT EXISTS token_usage (
    id TEXT PRIMARY KEY,
    requests INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    limited INTEGER NOT NULL DEFAULT 0
);
"""

_ADD_USAGE = """
INSERT INTO token_usage (id, requests, input_tokens, output_tokens, limited) VALUES (?, ?, ?, ?, ?)
ON CONFLICT (id) DO UPDATE SET requests = requests + excluded.requests,
    input_tokens = input_tokens + excluded.input_tokens, output_tokens = output_tokens + excluded.output_tokens,
    limited = limited + excluded.limited
"""


def _add_quota_columns(db: sqlite3.Connection) -> None:
    """A data folder made before tokens had quotas: their columns, empty (no bound)."""
    have = {row[1] for row in db.execute("PRAGMA table_info(tokens)")}
    for name in QUOTA_FIELDS:
        if name not in have:
            db.execute(f"ALTER TABLE tokens ADD COLUMN {name} INTEGER")  # a name of ours, never input


class TokenStore(ActiveTokens):
    """The tokens of one data folder. `authenticate` is called on every request: it reads
    the table again only when another connection (`lmsp token …`) has changed it."""

    def __init__(self, data_dir: Path) -> None:
        super().__init__()
        data_dir.mkdir(parents=True, exist_ok=True)
        path = data_dir / TOKENS_FILE
        if not path.exists():
            # Hashes only, but still nobody else's business on a shared machine.
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        self.path = path
        # One thread at a time: the event loop's, or the CLI's.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA busy_timeout=5000")
        self._db.executescript(_SCHEMA)
        _add_quota_columns(self._db)
        self._version: int | None = None
        # The serving process's usage reports: written from a worker thread, on a connection of
        # their own (the event loop's authenticates meanwhile).
        self._usage_db: sqlite3.Connection | None = None
        self._usage_lock = threading.Lock()

    def close(self) -> None:
        self._db.close()
        with self._usage_lock:
            if self._usage_db is not None:
                self._usage_db.close()

    def create(self, scopes: frozenset[str], name: str | None = None, quota: Quota = NO_QUOTA) -> tuple[str, TokenInfo]:
        while True:
            token, record = new_token(scopes, name, quota)
            try:
                self._db.execute(
                    "INSERT INTO tokens (id, hash, name, scopes, created_at, rpm, tpm, streams) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
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
                )
            except sqlite3.IntegrityError:  # that id was taken (1 in 2^48): draw again
                continue
            self._version = None  # data_version counts other connections' commits only
            return token, record

    def list(self) -> list[TokenInfo]:
        rows = self._db.execute(f"SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id")
        return [token_info(*row) for row in rows]

    def revoke(self, ident: str) -> builtins.list[TokenInfo]:
        ident = revoke_ident(ident)
        now = int(time.time())
        where = "revoked_at IS NULL AND (id = ? OR name = ?)"
        with self._db:  # one transaction: what is listed is what was revoked
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute(f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE {where}", (ident, ident)).fetchall()
            self._db.execute(f"UPDATE tokens SET revoked_at = ? WHERE {where}", (now, ident, ident))
        self._version = None
        return [token_info(*(*row[:4], now, *row[5:])) for row in rows]

    def set_quota(self, ident: str, changes: Mapping[str, int | None]) -> builtins.list[TokenInfo]:
        assignments, values = quota_changes(changes)
        ident = revoke_ident(ident)
        where = "revoked_at IS NULL AND (id = ? OR name = ?)"
        with self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(f"UPDATE tokens SET {assignments} WHERE {where}", (*values, ident, ident))
            rows = self._db.execute(f"SELECT {TOKEN_COLUMNS} FROM tokens WHERE {where}", (ident, ident)).fetchall()
        self._version = None
        return [token_info(*row) for row in rows]

    def usage(self) -> dict[str, TokenUsage]:
        rows = self._db.execute("SELECT id, requests, input_tokens, output_tokens, limited FROM token_usage")
        return {row[0]: TokenUsage(*row[1:]) for row in rows}

    def add_usage(self, used: Mapping[str, TokenUsage]) -> None:
        with self._usage_lock:
            if self._usage_db is None:
                self._usage_db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
                self._usage_db.execute("PRAGMA busy_timeout=5000")
            db = self._usage_db
            with db:
                db.execute("BEGIN IMMEDIATE")
                db.executemany(
                    _ADD_USAGE,
                    [(ident, u.requests, u.input_tokens, u.output_tokens, u.limited) for ident, u in used.items()],
                )

    def _refresh(self) -> None:
        # data_version changes when any other connection commits: a revoke takes effect on
        # the next request, without reading the table on every one.
        (version,) = self._db.execute("PRAGMA data_version").fetchone()
        if version == self._version:
            return
        rows = self._db.execute(f"SELECT hash, {TOKEN_COLUMNS} FROM tokens WHERE revoked_at IS NULL")
        self._load(rows)
        self._version = version
