"""The idempotency claims' contract (the `claim_key`, `finish_key`, `release_key` part of
lmsp/store/base.py `Store`), on every store backend: a key is claimed by one request, which
then finishes (its result replayed to every retry) or releases it. Through the interface only."""

from __future__ import annotations

from collections.abc import Callable

from lmsp.store import Store

ALICE = "token:alice001"
BOB = "token:bob00001"
NOW = 1_700_000_000.0
TTL = 86_400.0
FINGERPRINT = b"\x01" * 32
OTHER_FINGERPRINT = b"\x02" * 32
HEADERS = [("content-type", "application/json"), ("location", "/lmsp/v1/tasks/task_1")]
BODY = b'{"id":"task_1","status":"in_progress"}'


def test_the_first_claim_of_a_key_gets_it(store: Store) -> None:
    assert store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL) is None


def test_a_second_claim_while_the_first_runs_sees_it_running(store: Store) -> None:
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL)
    held = store.claim_key(ALICE, "k1", OTHER_FINGERPRINT, NOW + 1, TTL)
    assert held is not None
    assert held.running and held.status is None
    assert held.fingerprint == FINGERPRINT  # the first request's, to tell a retry from a misuse
    assert held.created_at == NOW


def test_a_finished_claim_replays_its_result(store: Store) -> None:
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL)
    store.finish_key(ALICE, "k1", 202, HEADERS, BODY)
    for later in (NOW + 1, NOW + 2):  # every retry, not only the first
        record = store.claim_key(ALICE, "k1", FINGERPRINT, later, TTL)
        assert record is not None
        assert not record.running
        assert (record.status, record.headers, record.body) == (202, tuple(HEADERS), BODY)
        assert record.fingerprint == FINGERPRINT


def test_a_finished_claim_with_no_headers_and_no_body(store: Store) -> None:
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL)
    store.finish_key(ALICE, "k1", 204, [], b"")
    record = store.claim_key(ALICE, "k1", FINGERPRINT, NOW + 1, TTL)
    assert record is not None
    assert (record.status, record.headers, record.body) == (204, (), b"")


def test_keys_belong_to_their_owner(store: Store) -> None:
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL)
    store.finish_key(ALICE, "k1", 200, HEADERS, BODY)
    assert store.claim_key(BOB, "k1", FINGERPRINT, NOW + 1, TTL) is None  # Bob's own key
    bobs = store.claim_key(BOB, "k1", FINGERPRINT, NOW + 2, TTL)
    assert bobs is not None and bobs.running


def test_a_released_claim_is_free_to_claim_again(store: Store) -> None:
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL)
    store.release_key(ALICE, "k1")
    assert store.claim_key(ALICE, "k1", OTHER_FINGERPRINT, NOW + 1, TTL) is None
    held = store.claim_key(ALICE, "k1", FINGERPRINT, NOW + 2, TTL)
    assert held is not None and held.fingerprint == OTHER_FINGERPRINT


def test_release_leaves_a_finished_claim_as_it_is(store: Store) -> None:
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL)
    store.finish_key(ALICE, "k1", 200, HEADERS, BODY)
    store.release_key(ALICE, "k1")
    record = store.claim_key(ALICE, "k1", FINGERPRINT, NOW + 1, TTL)
    assert record is not None and record.status == 200


def test_release_of_an_unknown_key_does_nothing(store: Store) -> None:
    store.release_key(ALICE, "never-claimed")
    assert store.claim_key(ALICE, "never-claimed", FINGERPRINT, NOW, TTL) is None


def test_a_claim_older_than_the_ttl_is_gone(store: Store) -> None:
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, 10.0)
    store.finish_key(ALICE, "k1", 200, HEADERS, BODY)
    held = store.claim_key(ALICE, "k1", FINGERPRINT, NOW + 5, 10.0)
    assert held is not None  # within the ttl: kept
    assert store.claim_key(ALICE, "k1", OTHER_FINGERPRINT, NOW + 11, 10.0) is None  # past it: a new claim


def test_a_finished_claim_outlives_the_store_being_closed(open_store: Callable[[], Store], store: Store) -> None:
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL)
    store.finish_key(ALICE, "k1", 201, HEADERS, BODY)
    store.close()
    record = open_store().claim_key(ALICE, "k1", FINGERPRINT, NOW + 1, TTL)
    assert record is not None
    assert (record.status, record.headers, record.body) == (201, tuple(HEADERS), BODY)


def test_a_claim_is_seen_by_another_opening_of_the_store(open_store: Callable[[], Store], store: Store) -> None:
    other = open_store()  # another replica (PostgreSQL), or the next process (SQLite)
    store.claim_key(ALICE, "k1", FINGERPRINT, NOW, TTL)
    store.finish_key(ALICE, "k1", 200, HEADERS, BODY)
    record = other.claim_key(ALICE, "k1", FINGERPRINT, NOW + 1, TTL)
    assert record is not None and record.status == 200
