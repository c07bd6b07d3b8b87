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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CHANGE_SEEN_WITHIN",
    "NO_QUOTA",
    "PREFIX",
    "QUOTA_FIELDS",
    "ActiveTokens",
    "Quota",
    "TokenInfo",
    "TokenUsage",
    "Tokens",
    "digest",
    "TOKEN_COLUMNS",
    "new_token",
    "quota_changes",
    "revoke_ident",
    "token_info",
]

PREFIX = "lmsp_"
# Seconds within which a token created or revoked through another opening (`lmsp token …`,
# another replica) holds here: the next request on SQLite, a notification's delay on PostgreSQL.
CHANGE_SEEN_WITHIN = 2.0
_ID_CHARS = 8


@dataclass(frozen=True)
class Quota:
    """What one token may use (None: no bound of that kind). Kept with the token, enforced per
    replica by security/quota.py."""

    rpm: int | None = None  # requests a minute that ask for model work
    tpm: int | None = None  # input + output tokens a minute
    streams: int | None = None  # such requests (and the generations they started) at once

    @property
    def any(self) -> bool:
        return self.rpm is not None or self.tpm is not None or self.streams is not None


NO_QUOTA = Quota()

# The quota's columns, in both backends' tables, in this order.
QUOTA_FIELDS = ("rpm", "tpm", "streams")


@dataclass
class TokenUsage:
    """What a token has used: counted by each serving process, added up in the token store."""

    requests: int = 0  # admitted requests that asked for model work
    input_tokens: int = 0
    output_tokens: int = 0
    limited: int = 0  # requests refused by the token's quota (429)

    def add(self, other: TokenUsage) -> None:
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.limited += other.limited

    def __bool__(self) -> bool:
        return bool(self.requests or self.input_tokens or self.output_tokens or self.limited)


@dataclass(frozen=True)
class TokenInfo:
    id: str
    name: str | None
    scopes: frozenset[str]
    created_at: int
    revoked_at: int | None
    quota: Quota = NO_QUOTA

    @property
    def owner(self) -> str:
        """Whose stored responses and tasks these are (never `local`, the tokenless owner)."""
        return f"token:{self.id}"


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def new_token(scopes: frozenset[str], name: str | None, quota: Quota = NO_QUOTA) -> tuple[str, TokenInfo]:
    """A fresh token and its record; the caller stores `digest(token)` under the record's id."""
    token = PREFIX + secrets.token_urlsafe(32)
    while token[len(PREFIX)] == "-":  # an id like `-mUl…` would read as an option to `lmsp token revoke ID`
        token = PREFIX + secrets.token_urlsafe(32)
    ident = token[len(PREFIX) : len(PREFIX) + _ID_CHARS]
    return token, TokenInfo(ident, name, scopes, int(time.time()), None, quota)


class Tokens(Protocol):
    """Where the tokens are kept. `authenticate` and `any_active` are called on every request,
    on the event loop: they never wait for a database (PostgreSQL's answer from a snapshot its
    watcher keeps current, tokens/postgres.py), and see a change committed anywhere within a
    moment (`CHANGE_SEEN_WITHIN`); they raise ProblemError 503 when they cannot be trusted."""

    def create(self, scopes: frozenset[str], name: str | None = None, quota: Quota = NO_QUOTA) -> tuple[str, TokenInfo]:
        """A new token (returned once: only its hash is kept) and its record."""
        ...

    def list(self) -> list[TokenInfo]: ...

    def revoke(self, ident: str) -> builtins.list[TokenInfo]:
        """Revokes the active tokens whose id or name is `ident`; returns them."""
        ...

    def set_quota(self, ident: str, changes: Mapping[str, int | None]) -> builtins.list[TokenInfo]:
        """Sets the named `QUOTA_FIELDS` (None: no bound) of the active tokens whose id or name
        is `ident`; returns them as they are now. Holds on a running service as a revoke does."""
        ...

    def usage(self) -> dict[str, TokenUsage]:
        """What each token has used, by id, as the serving processes have reported it."""
        ...

    def add_usage(self, used: Mapping[str, TokenUsage]) -> None:
        """Adds a serving process's counts since its last report. Blocks (a database write):
        call it off the event loop."""
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
        """(hash, id, name, scopes, created_at, revoked_at, rpm, tpm, streams) rows of the
        active tokens (`TOKEN_COLUMNS` after the hash)."""
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


# A token's record as both backends select it; `token_info` takes a row of them.
TOKEN_COLUMNS = "id, name, scopes, created_at, revoked_at, rpm, tpm, streams"


def token_info(
    ident: str,
    name: str | None,
    scopes: str,
    created_at: int,
    revoked_at: int | None,
    rpm: int | None = None,
    tpm: int | None = None,
    streams: int | None = None,
) -> TokenInfo:
    return TokenInfo(ident, name, frozenset(scopes.split(",")), created_at, revoked_at, Quota(rpm, tpm, streams))


def quota_changes(changes: Mapping[str, int | None], placeholder: str = "?") -> tuple[str, builtins.list[int | None]]:
    """`SET` assignments (`rpm = ?, …`) for the named quota fields, and their values; raises
    ValueError for a name that is not one (so no other name is ever part of any SQL)."""
    unknown = set(changes) - set(QUOTA_FIELDS)
    if unknown or not changes:
        raise ValueError(f"name quota fields among {', '.join(QUOTA_FIELDS)}")
    names = [f for f in QUOTA_FIELDS if f in changes]
    return ", ".join(f"{f} = {placeholder}" for f in names), [changes[f] for f in names]
