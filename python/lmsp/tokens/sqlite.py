"""The embedded tokens: `tokens.sqlite3` in the data folder, next to the embedded store."""

from __future__ import annotations

import builtins  # `list` is a method of the token classes, so the type is spelled in full
import os
import sqlite3
import time
from pathlib import Path

from .base import ActiveTokens, TokenInfo, digest, new_token, revoke_ident, token_info

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
"""


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
        self._version: int | None = None

    def close(self) -> None:
        self._db.close()

    def create(self, scopes: frozenset[str], name: str | None = None) -> tuple[str, TokenInfo]:
        while True:
            token, record = new_token(scopes, name)
            try:
                self._db.execute(
                    "INSERT INTO tokens (id, hash, name, scopes, created_at) VALUES (?, ?, ?, ?, ?)",
                    (record.id, digest(token), name, ",".join(sorted(scopes)), record.created_at),
                )
            except sqlite3.IntegrityError:  # that id was taken (1 in 2^48): draw again
                continue
            self._version = None  # data_version counts other connections' commits only
            return token, record

    def list(self) -> list[TokenInfo]:
        rows = self._db.execute("SELECT id, name, scopes, created_at, revoked_at FROM tokens ORDER BY created_at, id")
        return [token_info(*row) for row in rows]

    def revoke(self, ident: str) -> builtins.list[TokenInfo]:
        ident = revoke_ident(ident)
        now = int(time.time())
        where = "revoked_at IS NULL AND (id = ? OR name = ?)"
        with self._db:  # one transaction: what is listed is what was revoked
            self._db.execute("BEGIN IMMEDIATE")
            rows = self._db.execute(
                f"SELECT id, name, scopes, created_at FROM tokens WHERE {where}", (ident, ident)
            ).fetchall()
            self._db.execute(f"UPDATE tokens SET revoked_at = ? WHERE {where}", (now, ident, ident))
        self._version = None
        return [token_info(ident_, name, scopes, created_at, now) for ident_, name, scopes, created_at in rows]

    def _refresh(self) -> None:
        # data_version changes when any other connection commits: a revoke takes effect on
        # the next request, without reading the table on every one.
        (version,) = self._db.execute("PRAGMA data_version").fetchone()
        if version == self._version:
            return
        rows = self._db.execute(
            "SELECT hash, id, name, scopes, created_at, revoked_at FROM tokens WHERE revoked_at IS NULL"
        )
        self._load(rows)
        self._version = version
