"""Bearer tokens behind one interface (`Tokens`): SQLite in the data folder by default
(tokens/sqlite.py), or the PostgreSQL store replicas share (tokens/postgres.py, imported only
when asked for: psycopg is the `replicas` extra). Which one serves is state/'s choice."""

from __future__ import annotations

from .base import (
    NO_QUOTA,
    PREFIX,
    QUOTA_FIELDS,
    TOKEN_COLUMNS,
    ActiveTokens,
    Quota,
    TokenInfo,
    Tokens,
    TokenUsage,
    digest,
    new_token,
    quota_changes,
    revoke_ident,
    token_info,
)

__all__ = [
    "NO_QUOTA",
    "PREFIX",
    "QUOTA_FIELDS",
    "TOKEN_COLUMNS",
    "ActiveTokens",
    "Quota",
    "TokenInfo",
    "TokenUsage",
    "Tokens",
    "digest",
    "new_token",
    "quota_changes",
    "revoke_ident",
    "token_info",
]
