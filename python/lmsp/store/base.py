"""The store's interface and the records it keeps.

Every record belongs to an owner: the token that made it (§10). Until tokens exist, the
service passes one fixed owner; the keys are already shaped for many.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import orjson

__all__ = ["IdempotencyRecord", "Store", "StoredResponse", "StoredTask"]


@dataclass(frozen=True)
class StoredResponse:
    """A finished response kept for GET and `previous_response_id` (R6.1-5, R6.2-6)."""

    response: dict[str, Any]  # the response object, folded from its events
    input: list[dict[str, Any]]  # every input item it was generated from, oldest first

    @property
    def id(self) -> str:
        return str(self.response["id"])


@dataclass(frozen=True)
class IdempotencyRecord:
    """What the first request with a key did (§9). `status` is None while it still runs."""

    fingerprint: bytes
    created_at: float
    status: int | None = None
    headers: tuple[tuple[str, str], ...] = ()
    body: bytes = b""

    @property
    def running(self) -> bool:
        return self.status is None


@dataclass(frozen=True)
class StoredTask:
    """A task (§7): kept when created and again when final, so that GET answers after its
    events expired and after a restart."""

    task: dict[str, Any]  # the task object as GET returns it
    model: str  # to build a failed response for a task a dead process left running
    last_event_id: int  # the id of its final event, once final (204 vs 410 on resume)

    @property
    def id(self) -> str:
        return str(self.task["id"])

    def row(self, owner: str) -> tuple[Any, ...]:
        """Its row in the tasks table, in column order: owner, id, status, model,
        last_event_id, task (JSON), created_at, response_id, size (the JSON's bytes, counted by
        the byte quota)."""
        task = orjson.dumps(self.task)
        status, created_at, response_id = self.task["status"], self.task["created_at"], self.task["response_id"]
        return (owner, self.id, status, self.model, self.last_event_id, task, created_at, response_id, len(task))


class Store(Protocol):
    """Blocking calls; the service makes them on the store's own thread (`StoreWorker`)."""

    def put_response(self, owner: str, stored: StoredResponse) -> None:
        """Keeps it durably: when this returns, a crash of the process cannot lose it."""
        ...

    def get_response(self, owner: str, response_id: str) -> StoredResponse | None: ...

    def delete_response(self, owner: str, response_id: str) -> bool:
        """Forgets every copy of the owner's response, in one transaction: the stored
        response, the task records that carry it and the idempotency records whose kept answer
        holds it. All or nothing, so a retry after a failure finds what it needs to finish;
        False when there was no copy."""
        ...

    def response_tasks(self, owner: str, response_id: str) -> list[str]:
        """The ids of the owner's task records that carry the response (their events are
        dropped before `delete_response` forgets the records that name them)."""
        ...

    def expire_responses(self, before: int) -> int:
        """The retention sweep: forgets every owner's stored responses and final task records
        created before `before` (Unix seconds), and the finished idempotency records claimed
        before it. Returns how many responses and task records."""
        ...

    def trim_responses(self, owner: str, keep: int) -> int:
        """Forgets the owner's oldest responses beyond the newest `keep` (the per-owner quota).
        Returns how many."""
        ...

    def trim_response_bytes(self, owner: str, max_bytes: int) -> int:
        """Forgets the owner's oldest responses until the rest hold at most `max_bytes` (a
        response's size: its response and input as kept, JSON bytes), the newest always kept
        (the per-owner byte quota). Returns how many."""
        ...

    def trim_tasks(self, owner: str, keep: int) -> int:
        """Forgets the owner's oldest final task records beyond the newest `keep` (they hold
        whole responses, `store: false` ones too). Running ones are never counted nor forgotten.
        Returns how many."""
        ...

    def trim_task_bytes(self, owner: str, max_bytes: int) -> int:
        """As `trim_response_bytes`, for the owner's final task records (a record's size: its
        JSON bytes). Returns how many."""
        ...

    def claim_key(self, owner: str, key: str, fingerprint: bytes, now: float, ttl: float) -> IdempotencyRecord | None:
        """Claims `key` for a new request (None), or returns the live record that holds it.
        Records older than `ttl` seconds are gone."""
        ...

    def finish_key(self, owner: str, key: str, status: int, headers: list[tuple[str, str]], body: bytes) -> None: ...

    def release_key(self, owner: str, key: str) -> None:
        """Forgets a claim whose request left no result to replay."""
        ...

    def put_task(self, owner: str, stored: StoredTask) -> None:
        """Keeps it durably, replacing an earlier version."""
        ...

    def get_task(self, owner: str, task_id: str) -> StoredTask | None: ...

    def heartbeat(self, now: float) -> None:
        """This process is alive: a store shared by several replicas frees the running claims
        of one that stopped saying so (see PostgresStore)."""
        ...

    def ping(self) -> None:
        """Raises (as any call would) when the store cannot be reached: the readiness probe."""
        ...

    def running_tasks(self) -> list[tuple[str, StoredTask]]:
        """(owner, task) of every task not yet final: once before serving when one process
        owns the store, else by the lease sweep (service/tasks.py)."""
        ...

    def close(self) -> None: ...
