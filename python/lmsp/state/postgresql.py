"""The shared store and tokens (`postgresql://…`): one PostgreSQL database every replica uses.
Imported only when asked for: psycopg is the `replicas` extra."""

from __future__ import annotations

import psycopg
from psycopg_pool import PoolTimeout

from ..store import StoreWorker
from ..store.postgres import PostgresStore
from ..tokens import Tokens
from ..tokens.postgres import PostgresTokens
from .backend import Backend, StateConfig, StateError, without_password

__all__ = ["BACKEND", "CONNECTIONS"]

# How many connections (and store threads) a replica holds to the shared store.
CONNECTIONS = 4


def open_store(url: str, config: StateConfig) -> StoreWorker:
    try:
        # A replica says it is alive every half lease (the lease sweep): three leases unseen, it is dead.
        store = PostgresStore(url, max_connections=CONNECTIONS, stale_after=3 * config.task_lease)
    except (psycopg.Error, PoolTimeout) as exc:
        raise StateError(f"cannot open the store {without_password(url)}: {exc}") from None
    return StoreWorker(store, threads=CONNECTIONS)


def open_tokens(url: str, config: StateConfig) -> Tokens:
    try:
        return PostgresTokens(url)
    except psycopg.Error as exc:
        raise StateError(f"cannot open the tokens in {without_password(url)}: {exc}") from None


BACKEND = Backend(store=open_store, tokens=open_tokens, shared=True)
