"""Every backend of each kind of state, opened through the registry (lmsp/state/registry.py)
as the service opens it: the embedded ones always, PostgreSQL and Redis on real servers started
here once per session (their tests skip, saying why, where the binaries are not installed).

A new backend is held to the contract by adding its scheme to a list below and a branch to
the URL fixture that makes a fresh one; the suites themselves know no backend."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from lmsp.state import StateConfig, backend
from lmsp.store import Store
from lmsp.testing_servers import missing_servers, new_database, postgres_server, redis_server
from lmsp.tokens import Tokens

STORES = ["sqlite", "postgresql"]  # stored responses, task records, idempotency claims; tokens
EVENTS = ["memory", "redis"]  # task events

# Small bounds, so that the suites can fill a ring and outwait an expiry.
RING_EVENTS = 8
RING_BYTES = 1 << 20
RETENTION = 1.0


def _need_servers() -> None:
    why = missing_servers()
    if why is not None:
        pytest.skip(why)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    _need_servers()
    with postgres_server() as url:
        yield url


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    _need_servers()
    with redis_server() as url:
        yield url


@pytest.fixture
def config(tmp_path: Path) -> StateConfig:
    return StateConfig(
        data_dir=tmp_path, task_events_max=RING_EVENTS, task_events_bytes=RING_BYTES, task_retention=RETENTION
    )


@pytest.fixture(params=STORES)
def store_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty store's URL."""
    if request.param == "sqlite":
        return "sqlite:"  # in the test's own data folder (`config`)
    server: str = request.getfixturevalue("postgres_url")
    return new_database(server, f"contract_{uuid.uuid4().hex}")


@pytest.fixture(params=EVENTS)
def events_url(request: pytest.FixtureRequest) -> str:
    if request.param == "memory":
        return "memory:"
    url: str = request.getfixturevalue("redis_url")
    return url  # task ids are fresh in every test: nothing to empty


@pytest.fixture
def open_store(store_url: str, config: StateConfig) -> Iterator[Callable[[], Store]]:
    """Opens the store at `store_url` (again: a second process, or the same after a restart)."""
    workers = []

    def open_() -> Store:
        factory = backend(store_url).store
        assert factory is not None
        worker = factory(store_url, config)
        workers.append(worker)
        return worker.store

    yield open_
    for worker in workers:
        worker.close()


@pytest.fixture
def store(open_store: Callable[[], Store]) -> Store:
    return open_store()


@pytest.fixture
def open_tokens(store_url: str, config: StateConfig) -> Iterator[Callable[[], Tokens]]:
    """Opens the tokens kept with the store at `store_url` (again: `lmsp token` beside `serve`)."""
    opened: list[Tokens] = []

    def open_() -> Tokens:
        factory = backend(store_url).tokens
        assert factory is not None
        tokens = factory(store_url, config)
        opened.append(tokens)
        return tokens

    yield open_
    for tokens in opened:
        tokens.close()


@pytest.fixture
def tokens(open_tokens: Callable[[], Tokens]) -> Tokens:
    return open_tokens()
