"""The token check's cost (issue 27): requests/s of `GET /lmsp/v1/models` with a Bearer token,
on a replica whose tokens live in PostgreSQL (authenticated from the in-memory snapshot its
watcher keeps current: no database round trip per request) against a server with the embedded
store (SQLite: one `PRAGMA data_version` per request), in the same run, one connection each,
requests sent one after another, the two servers measured by turns (ROUNDS rounds; the median
of the per-round ratios, as bench/scripts/paired.py does, so a noisy moment hits both).

And the check itself, in process: microseconds of one request's token check as the guard makes
it (`any_active`, `authenticate`) with PostgreSQL's snapshot against the embedded store's
per-request `PRAGMA data_version` (before issue 27, PostgreSQL's cost a query per request).

PostgreSQL and Redis are real servers started here (lmsp.testing_servers); the figures are "not
measured" with the reason where their binaries are missing."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

import httpx
import pytest

from figures import KEEP_LOADED, QUICK, SCRIPTED, not_measured
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import missing_servers, postgres_server, redis_server
from lmsp.tokens.postgres import PostgresTokens
from lmsp.tokens.sqlite import TokenStore

REQUESTS = 200 if QUICK else 2000
ROUNDS = 3 if QUICK else 7
SCOPES = frozenset({"models:read"})
_MISSING = missing_servers()


def _rate(url: str, token: str) -> float:
    """Requests/s of GET /models, sequential on one kept-alive connection (after a warm-up)."""
    with httpx.Client(base_url=url, timeout=30, headers={"authorization": f"Bearer {token}"}) as client:
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
    if shared is None:
        figures["tokens.models_embedded_req_s"] = statistics.median(_rate(srv.url, token) for _ in range(ROUNDS))
        figures["tokens.models_postgres_req_s"] = not_measured(str(_MISSING))
        figures["tokens.models_postgres_ratio"] = not_measured(str(_MISSING))
        return
    replica, shared_token = shared
    pairs = [(_rate(srv.url, token), _rate(replica.url, shared_token)) for _ in range(ROUNDS)]
    figures["tokens.models_embedded_req_s"] = statistics.median(e for e, _ in pairs)
    figures["tokens.models_postgres_req_s"] = statistics.median(p for _, p in pairs)
    figures["tokens.models_postgres_ratio"] = statistics.median(p / e for e, p in pairs)


def _check_us(tokens: PostgresTokens | TokenStore, token: str) -> float:
    """Microseconds of one request's token check as the guard makes it (any_active, then
    authenticate on what it read), on the caller's thread: the event loop's cost."""
    for _ in range(50):
        tokens.any_active()
        tokens.authenticate(token, fresh=True)
    started = time.perf_counter()
    for _ in range(REQUESTS * 5):
        assert tokens.any_active()
        assert tokens.authenticate(token, fresh=True) is not None
    return (time.perf_counter() - started) / (REQUESTS * 5) * 1e6


def test_one_token_check_on_the_loop(tmp_path, figures):
    embedded = TokenStore(tmp_path)
    figures["tokens.check_embedded_us"] = _check_us(embedded, embedded.create(SCOPES)[0])
    embedded.close()
    if _MISSING is not None:
        figures["tokens.check_postgres_us"] = not_measured(str(_MISSING))
        return
    with postgres_server() as postgres_url:
        shared = PostgresTokens(postgres_url)
        figures["tokens.check_postgres_us"] = _check_us(shared, shared.create(SCOPES)[0])
        shared.close()
