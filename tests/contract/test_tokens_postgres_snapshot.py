"""PostgreSQL's tokens beyond the common contract (tokens/postgres.py): a request's check makes
no round trip to the database, so it answers while the database is stopped, from the snapshot,
up to the staleness bound; past it, 503 service_unavailable with Retry-After (fails closed);
and the snapshot is current again soon after the database comes back."""

from __future__ import annotations

import os
import signal
import time
import uuid

import pytest

from lmsp.protocol.errors import ProblemError
from lmsp.testing_servers import new_database, postgres_pids
from lmsp.tokens.postgres import PostgresTokens

SCOPES = frozenset({"models:read"})
STALE_AFTER = 1.5
POLL = 0.2


def test_a_stopped_database_is_served_from_the_snapshot_then_refused_past_its_bound(postgres_url: str) -> None:
    tokens = PostgresTokens(new_database(postgres_url, f"snap_{uuid.uuid4().hex}"), poll=POLL, stale_after=STALE_AFTER)
    try:
        token, record = tokens.create(SCOPES)
        assert tokens.any_active() and tokens.authenticate(token) == record  # starts the watcher
        time.sleep(3 * POLL)
        pids = postgres_pids(postgres_url)
        assert pids
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert tokens.authenticate(token) == record  # from memory, at once
            assert time.monotonic() - started < 0.05
            time.sleep(STALE_AFTER + 2 * POLL)
            with pytest.raises(ProblemError) as refused:
                tokens.authenticate(token)
            assert refused.value.code == "service_unavailable"
            assert ("retry-after", "5") in refused.value.headers
            assert "127.0.0.1" not in refused.value.detail
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert tokens.authenticate(token) == record
                break
            except ProblemError:
                assert time.monotonic() < deadline, "the snapshot never became current again"
                time.sleep(POLL)
    finally:
        tokens.close()
