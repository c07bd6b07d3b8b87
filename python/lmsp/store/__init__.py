"""What the service keeps durably: stored responses, tasks and idempotency records, behind one
small interface (`Store`): SQLite embedded by default, PostgreSQL shared by several replicas
(store/postgres.py, imported only when asked for: psycopg is the `replicas` extra)."""

from __future__ import annotations

from .base import IdempotencyRecord, Store, StoredResponse, StoredTask
from .sqlite import SqliteStore
from .worker import StoreWorker

__all__ = ["IdempotencyRecord", "SqliteStore", "Store", "StoreWorker", "StoredResponse", "StoredTask"]
