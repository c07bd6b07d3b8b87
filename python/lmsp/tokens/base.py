"""Bearer tokens: the interface every backend keeps them behind (`Tokens`), their records, and
what all backends share (making, hashing and checking a token; `ActiveTokens`).

A token is `lmsp_` and 43 URL-safe characters (256 random bits). Its first 8 characters after
`lmsp_` are its id: not secret, shown by `lmsp token list`, used to find its record and to own
what it creates. The rest stays secret; only the SHA-256 of the whole token is stored. A fast
hash is the right one here: a slow password hash (bcrypt, scrypt) defends guessable secrets, and
a 256-bit random token cannot be guessed, so it would only add milliseconds to every request.
"""

from __future__ import annotations

import builtins  # `list` is a method of the token classes, so the type is spelled in full
import hashlib
import hmac
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CHANGE_SEEN_WITHIN",
    "PREFIX",
    "ActiveTokens",
    "TokenInfo",
    "Tokens",
    "digest",
    "new_token",
    "revoke_ident",
    "token_info",
]

PREFIX = "lmsp_"
# Seconds within which a token created or revoked through another opening (`lmsp token …`,
# another replica) holds here: the next request on SQLite, a notification's delay on PostgreSQL.
CHANGE_SEEN_WITHIN = 2.0
_ID_CHARS = 8


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
    on the event loop: they never wait for a database (PostgreSQL's answer from a snapshot its
    watcher keeps current, tokens/postgres.py), and see a change committed anywhere within a
    moment (`CHANGE_SEEN_WITHIN`); they raise ProblemError 503 when they cannot be trusted."""

    def create(self, scopes: frozenset[str], name: str | None = None) -> tuple[str, TokenInfo]:
        """A new token (returned once: only its hash is kept) and its record."""
        ...

    def list(self) -> list[TokenInfo]: ...

    def revoke(self, ident: str) -> builtins.list[TokenInfo]:
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


def revoke_ident(ident: str) -> str:
    """What `lmsp token revoke` names: an id (`lmsp_` in front or not) or a name."""
    return ident.removeprefix(PREFIX)


def token_info(ident: str, name: str | None, scopes: str, created_at: int, revoked_at: int | None) -> TokenInfo:
    return TokenInfo(ident, name, frozenset(scopes.split(",")), created_at, revoked_at)
