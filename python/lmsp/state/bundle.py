"""One bundle of everything the service keeps beyond a request: the store (stored responses,
task records, idempotency claims), the task events and the tokens, each opened by the backend
its URL's scheme names (registry.py). Whoever holds the bundle never asks which backends
are in it."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import TaskEvents
from ..events.residency import InProcessResidency, Residency
from ..store import StoreWorker
from ..tokens import Tokens
from .backend import Backend, StateConfig, StateError, without_password
from .registry import backend

__all__ = ["State", "open_state", "open_tokens"]


@dataclass
class State:
    store: StoreWorker
    events: TaskEvents
    tokens: Tokens
    # Which replica holds which models: read and written only by a replica that routes
    # (`--advertise-url`), on the serving loop (http/forward.py starts and closes it).
    residency: Residency = field(default_factory=InProcessResidency)

    def close(self) -> None:
        """Closes the store and the tokens. The events are started and closed on the serving
        loop (`TasksService.start`, `aclose`), as their listeners live there."""
        self.store.close()
        self.tokens.close()


def _store_backend(url: str) -> Backend:
    found = backend(url)
    if found.store is None or found.tokens is None:
        raise StateError(f"{without_password(url)} keeps no store: --store takes a store's URL")
    return found


def open_tokens(config: StateConfig) -> Tokens:
    """The tokens alone (`lmsp token …`): where the store is."""
    found = _store_backend(config.store_url)
    assert found.tokens is not None  # checked by _store_backend
    return found.tokens(config.store_url, config)


def open_state(config: StateConfig) -> State:
    """Opens the bundle; StateError (nothing left open) when any part cannot be."""
    stores, events = _store_backend(config.store_url), backend(config.events_url)
    assert stores.store is not None and stores.tokens is not None  # checked by _store_backend
    if events.events is None:
        raise StateError(
            f"{without_password(config.events_url)} keeps no task events: --events takes an event log's URL"
        )
    if events.shared and not stores.shared:
        # Replicas share task records as well as events: one replica's task read through
        # another has its record in the store they share.
        raise StateError(
            f"--events {without_password(config.events_url)} is shared by replicas and needs a store they share "
            "too: --store postgresql://…"
        )
    if stores.shared and not events.shared:
        # A shared store means replicas: each one's start would find the others' running
        # tasks (their events in no process it can reach) and end them failed. Refused, not
        # half-supported.
        raise StateError(
            f"--store {without_password(config.store_url)} is shared by replicas, and replicas need a task "
            "event log they share too: add --events redis://… (or use the embedded store, --store sqlite:)"
        )
    tokens = stores.tokens(config.store_url, config)
    try:
        store = stores.store(config.store_url, config)
        try:
            residency = events.residency(config.events_url, config) if events.residency is not None else None
            return State(
                store=store,
                events=events.events(config.events_url, config),
                tokens=tokens,
                residency=residency or InProcessResidency(),
            )
        except BaseException:
            store.close()
            raise
    except BaseException:
        tokens.close()
        raise
