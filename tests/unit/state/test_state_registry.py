"""The state registry (lmsp/state): backends found by URL scheme, one bundle, refusals that
say what to do. What each backend then does is the contract suites' (tests/contract/)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from lmsp.state import BACKENDS, Backend, StateConfig, StateError, backend, open_state, open_tokens
from lmsp.store import StoredResponse


def test_the_default_bundle_is_embedded_and_works(tmp_path: Path) -> None:
    state = open_state(StateConfig(data_dir=tmp_path))
    try:
        stored = StoredResponse(response={"id": "resp_1", "created_at": 1}, input=[])
        state.store.store.put_response("local", stored)
        assert state.store.store.get_response("local", "resp_1") == stored
        assert state.tokens.any_active() is False
        assert state.events.lease > 0
    finally:
        state.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == ".sqlite3") == ["lmsp.sqlite3", "tokens.sqlite3"]


def test_tokens_alone_are_those_of_the_same_store(tmp_path: Path) -> None:
    state = open_state(StateConfig(data_dir=tmp_path))
    try:
        token, record = state.tokens.create(frozenset({"models:read"}), "ci")
    finally:
        state.close()
    tokens = open_tokens(StateConfig(data_dir=tmp_path))
    try:
        assert tokens.authenticate(token) == record
    finally:
        tokens.close()


def test_every_registered_module_declares_a_backend() -> None:
    for scheme, module in BACKENDS.items():
        assert isinstance(importlib.import_module(module).BACKEND, Backend), scheme
        assert backend(f"{scheme}://example") is importlib.import_module(module).BACKEND


@pytest.mark.parametrize("url", ["mysql://db/lmsp", "nothing-like-a-url", "file:///tmp/x"])
def test_an_unknown_scheme_is_refused_naming_the_known_ones(url: str) -> None:
    with pytest.raises(StateError, match="no state backend") as caught:
        backend(url)
    assert "postgresql:" in str(caught.value) and "redis:" in str(caught.value)


def test_a_password_never_shows_in_a_refusal() -> None:
    with pytest.raises(StateError) as caught:
        backend("mysql://user:hunter2@db/lmsp")
    assert "hunter2" not in str(caught.value)


def test_sqlite_takes_no_path(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="data folder"):
        open_state(StateConfig(data_dir=tmp_path, store_url="sqlite:///elsewhere"))


def test_shared_events_need_a_shared_store(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="postgresql://"):
        open_state(StateConfig(data_dir=tmp_path, events_url="redis://127.0.0.1:1/0"))
    assert list(tmp_path.iterdir()) == []  # refused before anything was opened


def test_a_shared_store_needs_shared_events(tmp_path: Path) -> None:
    # Refused before anything is opened: no server need be running at that address.
    with pytest.raises(StateError, match="--events redis://") as caught:
        open_state(StateConfig(data_dir=tmp_path, store_url="postgresql://lmsp:hunter2@127.0.0.1:1/lmsp"))
    assert "hunter2" not in str(caught.value)


def test_each_url_names_a_backend_of_its_kind(tmp_path: Path) -> None:
    with pytest.raises(StateError, match="keeps no store"):
        open_state(StateConfig(data_dir=tmp_path, store_url="memory:"))
    with pytest.raises(StateError, match="keeps no task events"):
        open_state(StateConfig(data_dir=tmp_path, events_url="sqlite:"))
