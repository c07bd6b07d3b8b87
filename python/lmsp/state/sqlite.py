"""The embedded store and tokens (`sqlite:`, the default): two SQLite files in the data folder."""

from __future__ import annotations

import sqlite3
from urllib.parse import urlsplit

from ..store import SqliteStore, StoreWorker
from ..tokens import Tokens
from ..tokens.sqlite import TokenStore
from .backend import Backend, StateConfig, StateError

__all__ = ["BACKEND", "STORE_FILE"]

STORE_FILE = "lmsp.sqlite3"


def _check(url: str) -> None:
    # The files' folder is the data folder (--data-dir): one place for all the service keeps.
    if urlsplit(url).path or urlsplit(url).netloc:
        raise StateError(f"{url}: sqlite: takes no path; the files are in the data folder (--data-dir)")


def open_store(url: str, config: StateConfig) -> StoreWorker:
    _check(url)
    path = config.data_dir / STORE_FILE
    try:
        return StoreWorker(SqliteStore(path))
    except (OSError, sqlite3.Error) as exc:
        raise StateError(f"cannot open the store {path}: {exc}") from None


def open_tokens(url: str, config: StateConfig) -> Tokens:
    _check(url)
    try:
        return TokenStore(config.data_dir)
    except (OSError, sqlite3.Error) as exc:
        raise StateError(f"cannot open the tokens in {config.data_dir}: {exc}") from None


BACKEND = Backend(store=open_store, tokens=open_tokens)
