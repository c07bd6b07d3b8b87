"""The token check's cost (issue 27): requests/s of `GET /lmsp/v1/models` with a Bearer token,
on a replica whose tokens live in PostgreSQL (authenticated from the in-memory snapshot its
watcher keeps current: no database round trip per request) against a server with the embedded
store (SQLite: one `PRAGMA data_version` per request), in the same run, one connection each,
requests sent one after another.

PostgreSQL and Redis are real servers started here (lmsp.testing_servers); the figures are "not
measured" with the reason where their binaries are missing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from figures import KEEP_LOADED, QUICK, SCRIPTED, not_measured
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import missing_servers, postgres_server, redis_server
from lmsp.tokens.postgres import PostgresTokens
from lmsp.tokens.sqlite import TokenStore

REQUESTS = 300 if QUICK else 3000
SCOPES = frozenset({"models:read"})
_MISSING = missing_servers()


def _rate(url: str, token: str) -> float:
    """Requests/s of GET /models, sequential on one kept-alive connection (after a warm-up)."""
    headers = {"authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, timeout=30, headers=headers) as client:
        for _ in range(20):
            assert client.get("/lmsp/v1/models").status_code == 200
        started = time.perf_counter()
        for _ in range(REQUESTS):
            assert client.get("/lmsp/v1/models").status_code == 200
        return REQUESTS / (time.perf_counter() - started)


@pytest.fixture(scope="module")
def embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    workdir = tmp_path_factory.mktemp("tokens-embedded")
    srv = start_server(workdir, "--scripted-model", SCRIPTED, *KEEP_LOADED)
    store = TokenStore(workdir / f"home-{srv.port}")  # its data folder (LMSP_HOME, lmsp.testing)
    token = store.create(SCOPES)[0]
    store.close()
    yield srv, token
    srv.stop()


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str] | None]:
    if _MISSING is not None:
        yield None
        return
    with redis_server() as redis_url, postgres_server() as postgres_url:
        tokens = PostgresTokens(postgres_url)
        token = tokens.create(SCOPES)[0]
        tokens.close()
        srv = start_server(
            tmp_path_factory.mktemp("tokens-postgres"),
            "--store", postgres_url, "--events", redis_url, "--scripted-model", SCRIPTED, *KEEP_LOADED,
        )  # fmt: skip
        yield srv, token
        srv.stop()


def test_models_with_postgresql_tokens_against_the_embedded_store(embedded, shared, figures):
    srv, token = embedded
    embedded_rate = _rate(srv.url, token)
    figures["tokens.models_embedded_req_s"] = embedded_rate
    if shared is None:
        figures["tokens.models_postgres_req_s"] = not_measured(str(_MISSING))
        figures["tokens.models_postgres_ratio"] = not_measured(str(_MISSING))
        return
    replica, shared_token = shared
    postgres_rate = _rate(replica.url, shared_token)
    figures["tokens.models_postgres_req_s"] = postgres_rate
    figures["tokens.models_postgres_ratio"] = postgres_rate / embedded_rate
