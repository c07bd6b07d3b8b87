"""A conversation's next turn sent where its past is (issue 40, http/affinity.py): two real
`lmsp serve` replicas with `--advertise-url` on real Redis and PostgreSQL, both with the model
loaded. A turn that B served, continued on A (a message list sent whole, or a stored response's
id), is sent on to B, whose memory holds its prompt state; another owner's same conversation is
not; one A served too stays on A; with B killed, A serves it itself at once."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis import Redis

from helpers import MODEL, body, store_token
from lmsp.events.residency import Residence
from lmsp.http.forward import BEAT_S
from lmsp.testing import RunningServer, start_server
from lmsp.testing_servers import missing_servers, postgres_server, redis_server

pytestmark = pytest.mark.skipif(missing_servers() is not None, reason=str(missing_servers()))

CHAT = "/v1/chat/completions"
OPENING = [
    {"role": "system", "content": "You are a brief guide to lighthouses."},
    {"role": "user", "content": "What is a lighthouse for?"},
]
# How long a key served on B takes at most to reach A's view, on a loaded machine: B's beat
# writes it, A's next beat reads it.
PUBLISHED_S = 30.0


@dataclass
class Fleet:
    a: RunningServer
    b: RunningServer
    tokens: dict[str, str]
    b_id: str
    redis: str

    def post(self, server: RunningServer, path: str, payload: dict[str, Any], who: str = "alice") -> httpx.Response:
        headers = {"authorization": f"Bearer {self.tokens[who]}"}
        return httpx.post(server.url + path, json=payload, headers=headers, timeout=120)

    def metric(self, server: RunningServer, name: str, **labels: str) -> float:
        text = httpx.get(server.url + "/metrics", headers={"authorization": f"Bearer {self.tokens['admin']}"}).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        return 0.0

    def b_keys(self) -> int:
        """How many conversations B's entry names now."""
        with Redis.from_url(self.redis) as redis:
            raw = redis.get(f"lmsp:replica:{self.b_id}")
        entry = Residence.decode(raw) if isinstance(raw, bytes) else None
        return len(entry.keys) if entry is not None else 0

    def served_by_b(self, path: str, payload: dict[str, Any], keys: int = 1) -> httpx.Response:
        """Sends a turn to B, then waits until B's entry names its `keys` new conversation
        keys and for A's next read of it."""
        before = self.b_keys()
        reply = self.post(self.b, path, payload)
        assert reply.status_code == 200 and reply.headers["lmsp-served-by"] == self.b_id, reply.text
        deadline = time.monotonic() + PUBLISHED_S
        while self.b_keys() < before + keys:
            assert time.monotonic() < deadline, f"B never published {keys} more conversations"
            time.sleep(BEAT_S / 5)
        time.sleep(3 * BEAT_S)
        return reply


def _replica(work: Path, redis_url: str, postgres_url: str) -> RunningServer:
    work.mkdir()
    return start_server(
        work,
        "--store", postgres_url,
        "--events", redis_url,
        "--advertise-url", "http://127.0.0.1",  # no port: the one it listens on
        "--preload", MODEL,
        "--keep-alive", "-1",
        "--parallel", "2",
    )  # fmt: skip


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("affinity")
    with redis_server() as redis_url, postgres_server() as postgres_url:
        tokens = {who: store_token(postgres_url, who) for who in ("alice", "bob")}
        tokens["admin"] = store_token(postgres_url, "admin", scopes="admin")
        b = _replica(work / "b", redis_url, postgres_url)
        try:
            a = _replica(work / "a", redis_url, postgres_url)
        except BaseException:
            b.stop()
            raise
        try:
            models = httpx.get(b.url + "/lmsp/v1/models", headers={"authorization": f"Bearer {tokens['alice']}"})
            b_id = models.headers["lmsp-served-by"]
            yield Fleet(a, b, tokens, b_id, redis_url)
        finally:
            a.stop()
            b.stop()


def _chat(messages: list[dict[str, str]]) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 12}


def _next_turn(reply: httpx.Response, question: str, past: list[dict[str, str]] = OPENING) -> list[dict[str, str]]:
    answer = reply.json()["choices"][0]["message"]["content"]
    return [*past, {"role": "assistant", "content": answer}, {"role": "user", "content": question}]


def test_a_conversations_next_turn_is_sent_where_its_past_is(fleet: Fleet) -> None:
    first = fleet.served_by_b(CHAT, _chat(OPENING))
    forwarded = fleet.metric(fleet.a, "lmsp_forwarded_requests_total", reason="affinity")
    second = fleet.post(fleet.a, CHAT, _chat(_next_turn(first, "Name a famous one.")))
    assert second.status_code == 200 and second.headers["lmsp-served-by"] == fleet.b_id
    # Read from B's memory: the past is not read again.
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert fleet.metric(fleet.a, "lmsp_forwarded_requests_total", reason="affinity") == forwarded + 1
    # Another owner's same conversation is another conversation: served where it landed.
    other = fleet.post(fleet.a, CHAT, _chat(_next_turn(first, "Name a famous one.")), who="bob")
    assert other.status_code == 200 and other.headers["lmsp-served-by"] != fleet.b_id


def test_a_stored_responses_continuation_is_sent_where_it_was_produced(fleet: Fleet) -> None:
    # Two keys: its opening (an input list), and the stored response it produced.
    first = fleet.served_by_b("/lmsp/v1/responses", body("Name three colors.", store=True, max_output_tokens=8), 2)
    follow = body("And three more.", store=True, max_output_tokens=8, previous_response_id=first.json()["id"])
    second = fleet.post(fleet.a, "/lmsp/v1/responses", follow)
    assert second.status_code == 200 and second.headers["lmsp-served-by"] == fleet.b_id


def test_a_conversation_served_here_too_stays_here(fleet: Fleet) -> None:
    """A served this conversation as well (a turn a sibling sent it, which it never sends on):
    its memory is as good as B's."""
    opening = [OPENING[0], {"role": "user", "content": "Who keeps a lighthouse?"}]
    first = fleet.served_by_b(CHAT, _chat(opening))
    headers = {"authorization": f"Bearer {fleet.tokens['alice']}", "lmsp-forwarded": "some-sibling"}
    marked = httpx.post(
        fleet.a.url + CHAT, json=_chat(_next_turn(first, "Still?", opening)), headers=headers, timeout=120
    )
    assert marked.status_code == 200 and marked.headers["lmsp-served-by"] != fleet.b_id
    later = fleet.post(fleet.a, CHAT, _chat(_next_turn(first, "Where?", opening)))
    assert later.status_code == 200 and later.headers["lmsp-served-by"] != fleet.b_id


def test_with_the_sibling_killed_the_next_turn_is_served_here(fleet: Fleet) -> None:
    """Last: it kills B. Its entry outlives it by up to its TTL; a turn sent to it meanwhile
    finds its port closed and is served here, counted as fallen back."""
    opening = [OPENING[0], {"role": "user", "content": "How tall are they?"}]
    first = fleet.served_by_b(CHAT, _chat(opening))
    fell_back = fleet.metric(fleet.a, "lmsp_forward_fallbacks_total", reason="unreachable")
    fleet.b.proc.send_signal(signal.SIGKILL)
    fleet.b.proc.wait(30)
    second = fleet.post(fleet.a, CHAT, _chat(_next_turn(first, "And the tallest?", opening)))
    assert second.status_code == 200 and second.headers["lmsp-served-by"] != fleet.b_id
    assert fleet.metric(fleet.a, "lmsp_forward_fallbacks_total", reason="unreachable") == fell_back + 1
