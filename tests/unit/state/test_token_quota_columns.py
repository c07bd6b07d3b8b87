"""A data folder whose tokens.sqlite3 was made before tokens had quotas opens with them empty."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from lmsp.tokens import NO_QUOTA, Quota
from lmsp.tokens.sqlite import TOKENS_FILE, TokenStore

_BEFORE = """
CREATE TABLE tokens (
    id TEXT PRIMARY KEY, hash BLOB NOT NULL, name TEXT, scopes TEXT NOT NULL,
    created_at INTEGER NOT NULL, revoked_at INTEGER
);
INSERT INTO tokens VALUES ('abcdefgh', x'00', 'old', 'models:read', 1, NULL);
"""


def test_an_older_tokens_file_gets_the_quota_columns(tmp_path: Path) -> None:
    db = sqlite3.connect(tmp_path / TOKENS_FILE)
    db.executescript(_BEFORE)
    db.close()
    tokens = TokenStore(tmp_path)
    try:
        (old,) = tokens.list()
        assert old.id == "abcdefgh" and old.quota == NO_QUOTA
        assert tokens.set_quota("old", {"rpm": 5})[0].quota == Quota(rpm=5)
    finally:
        tokens.close()
    TokenStore(tmp_path).close()  # and opens again, the columns there already
