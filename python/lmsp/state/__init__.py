"""Everything the service keeps beyond one request, as one bundle (`State`): the store (store/),
the task events (events/) and the tokens (tokens/), each behind its interface, with backends
chosen by URL scheme: embedded by default (`sqlite:` in the data folder, `memory:` rings),
`postgresql://` for the store and tokens, `redis://` for task events. registry.py is where a
new backend is added; tests/contract/ holds every backend to its interface."""

from __future__ import annotations

from .backend import Backend, StateConfig, StateError
from .bundle import State, open_state, open_tokens
from .registry import BACKENDS, DEFAULT_EVENTS, DEFAULT_STORE, backend

__all__ = [
    "BACKENDS",
    "DEFAULT_EVENTS",
    "DEFAULT_STORE",
    "Backend",
    "State",
    "StateConfig",
    "StateError",
    "backend",
    "open_state",
    "open_tokens",
]
