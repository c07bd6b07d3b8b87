"""Bearer tokens, kept hashed: in the data folder (`tokens.sqlite3`, `TokenStore`) by default, or
in the PostgreSQL store that several replicas share (store/postgres.py, `PostgresTokens`).

A token is `lmsp_` and 43 URL-safe characters (256 random bits). Its first 8 characters after
`lmsp_` are its id: not secret, shown by `lmsp token list`, used to find its record and to own
what it creates. The rest stays secret; only the SHA-256 of the whole token is stored. A fast
hash is the right one here: a slow password hash (bcrypt, scrypt) defends guessable secrets, and
a 256-bit random token cannot be guessed, so it would only add milliseconds to every request.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "TOKENS_FILE",
    "ActiveTokens",
    "TokenInfo",
    "TokenStore",
    "Tokens",
    "digest",
    "new_token",
    "revoke_ident",
    "token_info",
]

TOKENS_FILE = "tokens.sqlite3"
PREFIX = "lmsp_"
_ID_CHARS = 8

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


@dataclass(frozen=True)
class TokenInfo:
    id: str
    name: str | None
    scopes: frozenset[str]
    created_at: int
    revoked_at: int | None

    @property
    def owner(self) -> str:
        """Whose stored responses and tasks these are (never `local`, the tokenless owner)."""
        return f"token:{self.id}"


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def new_token(scopes: frozenset[str], name: str | None) -> tuple[str, TokenInfo]:
    """A fresh token and its record; the caller stores `digest(token)` under the record's id."""
    token = PREFIX + secrets.token_urlsafe(32)
    while token[len(PREFIX)] == "-":  # an id like `-mUl…` would read as an option to `lmsp token revoke ID`
        token = PREFIX + secrets.token_urlsafe(32)
    return token, TokenInfo(token[len(PREFIX) : len(PREFIX) + _ID_CHARS], name, scopes, int(time.time()), None)


class Tokens(Protocol):
    """Where the tokens are kept. `authenticate` and `any_active` are called on every request,
    on the event loop: they must see a revoke committed anywhere before that request."""

    def create(self, scopes: frozenset[str], name: str | None = None) -> tuple[str, TokenInfo]:
        """A new token (returned once: only its hash is kept) and its record."""
        ...

    def list(self) -> list[TokenInfo]: ...

    def revoke(self, ident: str) -> list[TokenInfo]:
        """Revokes the active tokens whose id or name is `ident`; returns them."""
        ...

    def any_active(self) -> bool: ...

    def authenticate(self, token: str, *, fresh: bool = False) -> TokenInfo | None:
        """`fresh`: this request's `any_active` has just read the store; not again."""
        ...

    def close(self) -> None: ...


class ActiveTokens:
    """The active tokens as last read, reread by `_refresh` only when the table changed."""

    def __init__(self) -> None:
        self._active: dict[str, tuple[bytes, TokenInfo]] = {}

    def _refresh(self) -> None:
        raise NotImplementedError

    def _load(self, rows: Iterable[Sequence[Any]]) -> None:
        """(hash, id, name, scopes, created_at, revoked_at) rows of the active tokens."""
        self._active = {row[1]: (bytes(row[0]), token_info(*row[1:])) for row in rows}

    def any_active(self) -> bool:
        self._refresh()
        return bool(self._active)

    def authenticate(self, token: str, *, fresh: bool = False) -> TokenInfo | None:
        """The active token's record, or None. The id only finds the record; the secret is
        checked by comparing hashes in constant time."""
        if not fresh:
            self._refresh()
        if not token.startswith(PREFIX):
            return None
        found = self._active.get(token[len(PREFIX) : len(PREFIX) + _ID_CHARS])
        if found is None or not hmac.compare_digest(found[0], digest(token)):
            return None
        return found[1]


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

    def revoke(self, ident: str) -> list[TokenInfo]:
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
        return [token_info(*row, now) for row in rows]

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


def revoke_ident(ident: str) -> str:
    """What `lmsp token revoke` names: an id (`lmsp_` in front or not) or a name."""
    return ident.removeprefix(PREFIX)


def token_info(ident: str, name: str | None, scopes: str, created_at: int, revoked_at: int | None) -> TokenInfo:
    return TokenInfo(ident, name, frozenset(scopes.split(",")), created_at, revoked_at)
