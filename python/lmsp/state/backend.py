"""What a state backend declares (`Backend`), what every backend is given to open with
(`StateConfig`), and the one error opening may raise (`StateError`).

A backend module (state/sqlite.py, state/postgresql.py, …) defines `BACKEND`: the kinds of
state it keeps, each as a function from its URL and the config to an open object behind that
kind's interface. The registry (state/registry.py) finds the module by the URL's scheme.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..events import DEFAULT_LEASE, DEFAULT_RETENTION, DEFAULT_TASK_BYTES, DEFAULT_TASK_EVENTS, TaskEvents
from ..events.residency import Residency
from ..store import StoreWorker
from ..tokens import Tokens

__all__ = ["DEFAULT_EVENTS", "DEFAULT_STORE", "Backend", "StateConfig", "StateError", "without_password"]

# Without --store / --events: everything embedded, in one process (schemes in registry.py).
DEFAULT_STORE = "sqlite:"
DEFAULT_EVENTS = "memory:"


class StateError(Exception):
    """A backend cannot be opened; the message says why, for a person (no password in it)."""


@dataclass(frozen=True)
class StateConfig:
    """Where each kind of state is kept, and what backends may need besides their URL."""

    data_dir: Path  # the embedded backends' folder, resolved
    store_url: str = DEFAULT_STORE  # the store and the tokens
    events_url: str = DEFAULT_EVENTS  # task events
    # A task's event ring, and how long its events outlive it: a shared copy keeps the same.
    task_events_max: int = DEFAULT_TASK_EVENTS
    task_events_bytes: int = DEFAULT_TASK_BYTES
    task_retention: float = DEFAULT_RETENTION
    # After this long unrenewed, a replica's task is abandoned; three leases unseen, it is dead.
    task_lease: float = DEFAULT_LEASE


@dataclass(frozen=True)
class Backend:
    """The kinds of state one URL scheme keeps; None where it keeps none of that kind."""

    store: Callable[[str, StateConfig], StoreWorker] | None = None
    tokens: Callable[[str, StateConfig], Tokens] | None = None
    events: Callable[[str, StateConfig], TaskEvents] | None = None
    # Which replica holds which models (events/residency.py): kept where the task events are,
    # the one channel every replica already shares.
    residency: Callable[[str, StateConfig], Residency] | None = None
    # Several processes may use it at once. Events shared by replicas need a shared store:
    # a task read through one replica must have its record there too.
    shared: bool = False


def without_password(url: str) -> str:
    """`url` fit for a message: any password in it dropped."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl() if "@" in parts.netloc else url
