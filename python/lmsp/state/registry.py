"""The state backends by URL scheme: the one place a new backend is added.

A new backend is a module defining `BACKEND` (state/backend.py says what that holds) and one
line below. Modules are named, not imported, here: a backend's client library (psycopg,
redis) is an optional extra, imported only when its scheme is asked for.
"""

from __future__ import annotations

import importlib
from urllib.parse import urlsplit

from .backend import DEFAULT_EVENTS, DEFAULT_STORE, Backend, StateError, without_password

__all__ = ["BACKENDS", "DEFAULT_EVENTS", "DEFAULT_STORE", "backend"]

BACKENDS: dict[str, str] = {
    "sqlite": "lmsp.state.sqlite",  # store and tokens in the data folder
    "memory": "lmsp.state.memory",  # task events in the ring of the process that runs the task
    "postgresql": "lmsp.state.postgresql",  # store and tokens shared by replicas
    "postgres": "lmsp.state.postgresql",
    "redis": "lmsp.state.redis",  # task events shared by replicas
    "rediss": "lmsp.state.redis",
}


def backend(url: str) -> Backend:
    """The backend that keeps state at `url`, by its scheme. StateError when no backend has
    that scheme or its extra is not installed."""
    scheme = urlsplit(url).scheme.lower()
    module_name = BACKENDS.get(scheme)
    if module_name is None:
        known = ", ".join(f"{s}:" for s in BACKENDS)
        raise StateError(f"{without_password(url)}: no state backend for {scheme or 'that'} URLs (known: {known})")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise StateError(f"{scheme}:// needs the replicas extra: pip install 'lmsp-server[replicas]' ({exc})") from None
    found = getattr(module, "BACKEND", None)
    if not isinstance(found, Backend):
        raise TypeError(f"{module_name} defines no BACKEND")  # a mistake in the registry, not a user's
    return found
