"""The tokens' contract (lmsp/tokens/base.py `Tokens`), on every backend that keeps them:
create, authenticate, list, revoke, and a change made through one opening (`lmsp token …`)
seen by another (the serving process) within CHANGE_SEEN_WITHIN. Through the interface only."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

from lmsp.tokens import NO_QUOTA, Quota, Tokens, TokenUsage
from lmsp.tokens.base import CHANGE_SEEN_WITHIN

SCOPES = frozenset({"models:read", "responses:write", "responses:read"})
TOKEN = re.compile(r"^lmsp_[A-Za-z0-9_-]{43}$")


def test_a_created_token_authenticates_as_its_record(tokens: Tokens) -> None:
    token, record = tokens.create(SCOPES, "ci")
    assert TOKEN.match(token)
    assert record.id == token[5:13] and record.name == "ci" and record.scopes == SCOPES
    assert record.revoked_at is None
    assert tokens.authenticate(token) == record
    assert tokens.authenticate(token, fresh=True) == record
    assert record.owner == f"token:{record.id}"


def test_a_token_without_a_name(tokens: Tokens) -> None:
    token, record = tokens.create(frozenset({"models:read"}))
    assert record.name is None
    assert tokens.authenticate(token) == record


def test_what_is_not_a_created_token_does_not_authenticate(tokens: Tokens) -> None:
    token, _ = tokens.create(SCOPES)
    forged = token[:13] + ("A" if token[13] != "A" else "B") + token[14:]  # its id, another secret
    for guess in (forged, token[5:], "lmsp_", "", "Bearer " + token, token + "x"):
        assert tokens.authenticate(guess) is None


def test_any_active_follows_create_and_revoke(tokens: Tokens) -> None:
    assert tokens.any_active() is False
    _, record = tokens.create(SCOPES)
    assert tokens.any_active() is True
    assert [r.id for r in tokens.revoke(record.id)] == [record.id]
    assert tokens.any_active() is False


def test_revoke_by_id_prefixed_id_or_name(tokens: Tokens) -> None:
    by_id, a = tokens.create(SCOPES, "a")
    by_prefixed, b = tokens.create(SCOPES, "b")
    by_name, c = tokens.create(SCOPES, "shared-name")
    by_name_too, d = tokens.create(SCOPES, "shared-name")
    kept, e = tokens.create(SCOPES, "kept")
    assert [r.id for r in tokens.revoke(a.id)] == [a.id]
    assert [r.id for r in tokens.revoke("lmsp_" + b.id)] == [b.id]
    assert sorted(r.id for r in tokens.revoke("shared-name")) == sorted([c.id, d.id])
    revoked = [by_id, by_prefixed, by_name, by_name_too]
    assert all(tokens.authenticate(t) is None for t in revoked)
    assert tokens.authenticate(kept) == e


def test_a_revoked_record_says_when_and_revoking_again_revokes_nothing(tokens: Tokens) -> None:
    _, record = tokens.create(SCOPES, "once")
    (revoked,) = tokens.revoke("once")
    assert revoked.id == record.id and revoked.revoked_at is not None
    assert revoked.revoked_at >= record.created_at
    assert tokens.revoke("once") == []
    assert tokens.revoke("no-such-token") == []


def test_list_holds_every_token_oldest_first_revoked_ones_included(tokens: Tokens) -> None:
    assert tokens.list() == []
    made = [tokens.create(SCOPES, f"t{i}")[1] for i in range(3)]
    tokens.revoke("t1")
    listed = tokens.list()
    assert [r.id for r in listed] == [r.id for r in sorted(made, key=lambda r: (r.created_at, r.id))]
    by_id = {r.id: r for r in listed}
    assert by_id[made[1].id].revoked_at is not None
    assert by_id[made[0].id].revoked_at is None and by_id[made[2].id].revoked_at is None
    assert {r.name for r in listed} == {"t0", "t1", "t2"}
    assert all(r.scopes == SCOPES for r in listed)


def _within(done: Callable[[], bool]) -> bool:
    """`done()` comes true within CHANGE_SEEN_WITHIN (a change made through another opening)."""
    deadline = time.monotonic() + CHANGE_SEEN_WITHIN
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_token_created_elsewhere_authenticates_within_a_moment(open_tokens: Callable[[], Tokens]) -> None:
    serving, cli = open_tokens(), open_tokens()
    assert serving.any_active() is False  # read once: what follows must not be missed
    token, record = cli.create(SCOPES, "from-the-cli")
    assert _within(serving.any_active)
    assert serving.authenticate(token, fresh=True) == record


def test_a_revoke_made_elsewhere_holds_within_a_moment(open_tokens: Callable[[], Tokens]) -> None:
    serving, cli = open_tokens(), open_tokens()
    token, _ = serving.create(SCOPES, "soon-revoked")
    other, other_record = serving.create(SCOPES, "kept")
    assert serving.authenticate(token) is not None
    cli.revoke("soon-revoked")
    assert _within(lambda: serving.authenticate(token) is None)
    assert serving.authenticate(other) == other_record


def test_tokens_outlive_their_opening(open_tokens: Callable[[], Tokens], tokens: Tokens) -> None:
    token, record = tokens.create(SCOPES, "durable")
    tokens.close()
    assert open_tokens().authenticate(token) == record


# --- quotas and usage (issue 38) ------------------------------------------------------------


def test_a_quota_is_kept_with_its_token_and_changed_by_id_or_name(tokens: Tokens) -> None:
    token, record = tokens.create(SCOPES, "metered", Quota(rpm=2, tpm=1000, streams=1))
    other, plain = tokens.create(SCOPES, "plain")
    assert record.quota == Quota(2, 1000, 1) and plain.quota == NO_QUOTA
    assert tokens.authenticate(token) == record  # the serving process reads it with the token
    (changed,) = tokens.set_quota("metered", {"rpm": 60, "streams": None})
    assert changed.id == record.id and changed.quota == Quota(rpm=60, tpm=1000, streams=None)
    seen = tokens.authenticate(token)
    assert seen is not None and seen.quota == changed.quota
    assert {t.id: t.quota for t in tokens.list()} == {record.id: changed.quota, plain.id: NO_QUOTA}
    assert tokens.set_quota("lmsp_" + plain.id, {"tpm": 5})[0].quota == Quota(tpm=5)
    tokens.revoke("metered")
    assert tokens.set_quota("metered", {"rpm": 1}) == []  # a revoked token is not changed
    assert tokens.authenticate(other) is not None


def test_usage_reports_add_up_per_token(tokens: Tokens) -> None:
    _, a = tokens.create(SCOPES, "a")
    _, b = tokens.create(SCOPES, "b")
    assert tokens.usage() == {}
    tokens.add_usage({a.id: TokenUsage(requests=2, input_tokens=10, output_tokens=5, limited=1)})
    tokens.add_usage(
        {a.id: TokenUsage(requests=1, input_tokens=3, output_tokens=4), b.id: TokenUsage(requests=1, limited=2)}
    )  # a second replica's report, or the next one
    assert tokens.usage() == {
        a.id: TokenUsage(requests=3, input_tokens=13, output_tokens=9, limited=1),
        b.id: TokenUsage(requests=1, limited=2),
    }
