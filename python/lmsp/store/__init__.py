"""What the service keeps durably: stored responses, tasks and idempotency records, behind one
small interface (`Store`) so that SQLite can later give way to a server-grade engine."""

from __future__ import annotations

from .base import IdempotencyRecord, Store, StoredResponse, StoredTask
from .sqlite import SqliteStore
from .worker import StoreWorker

__all__ = ["IdempotencyRecord", "SqliteStore", "Store", "StoreWorker", "StoredResponse", "StoredTask"]
