"""The shared prompt tier (`serve --cache-shared DIR`, engine/prompt_shared.py, issue 40): two
servers on one folder, as two replicas behind a round-robin balancer. A conversation's turn on
one, its next turn on the other: the second restores the past the first left (`cached_tokens`)
and answers what the first would have with its slot kept; another owner never restores it;
a damaged, truncated or foreign file is refused and the answer is what a fresh read gives; the
folder stays within its byte budget.

The model's digest is memoized in the data folder before the servers start (what a restart
finds), so the tier is usable from the first turn; its computing in the background is
tests/unit/engine/test_shared_tier.py's."""

from __future__ import annotations

import hashlib
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import MODEL, checked_client
from lmsp.engine.model_digest import ContentDigest, file_key
from lmsp.engine.prompt_file import FIXED
from lmsp.engine.registry import embedded_model_path
from lmsp.security.scopes import parse_scopes
from lmsp.testing import RunningServer, start_server
from lmsp.tokens.sqlite import TokenStore

CHAT = "/v1/chat/completions"
BUDGET = 12 * 1024 * 1024  # three or four of these conversations' states
ADMIN: list[str] = []  # the admin token's secret (GET /metrics), set by the fixture
TOPICS = ("lighthouses", "bread baking", "glaciers", "chess openings", "honey bees", "tidal power", "origami")


def preamble(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return f"You are a patient guide to {topic} (conversation {i}). " + (
        f"Answer briefly and plainly about {topic}, with one concrete example each time. " * 5
    )


class Pair:
    def __init__(self, one: RunningServer, two: RunningServer, tokens: dict[str, str], folder: Path) -> None:
        self.one, self.two, self.tokens, self.folder = one, two, tokens, folder

    def chat(self, server: RunningServer, who: str, messages: list[dict[str, str]], **extra: Any) -> tuple[str, int]:
        with checked_client(server.url) as c:
            c.headers["authorization"] = f"Bearer {self.tokens[who]}"
            payload = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 12, **extra}
            r = c.post(CHAT, json=payload)
        assert r.status_code == 200, r.text
        data = r.json()
        return data["choices"][0]["message"]["content"], data["usage"]["prompt_tokens_details"]["cached_tokens"]

    def turn_one(self, i: int, who: str = "alice") -> list[dict[str, str]]:
        """Conversation i's first turn on server one, its state written to the shared folder."""
        messages = [{"role": "system", "content": preamble(i)}, {"role": "user", "content": "Tell me one fact."}]
        before = shared_metric(self.one.url, "lmsp_prompt_cache_shared_writes_total")
        text, _ = self.chat(self.one, who, messages)
        deadline = time.monotonic() + 30
        while shared_metric(self.one.url, "lmsp_prompt_cache_shared_writes_total") <= before:
            assert time.monotonic() < deadline, "no shared write"
            time.sleep(0.05)
        return [*messages, {"role": "assistant", "content": text}, {"role": "user", "content": "Why does it matter?"}]

    def settled_files(self) -> set[Path]:
        """The folder's state files once none has come or gone for a second: a turn's state is
        written after its answer, by a writer thread, so an earlier test's may still be on its way."""
        files, quiet_since = set(self.folder.rglob("*.lmkv")), time.monotonic()
        deadline = quiet_since + 30
        while time.monotonic() - quiet_since < 1.0 and time.monotonic() < deadline:
            time.sleep(0.1)
            now = set(self.folder.rglob("*.lmkv"))
            if now != files:
                files, quiet_since = now, time.monotonic()
        return files

    def file_of(self, n_before: set[Path]) -> Path:
        (path,) = set(self.folder.rglob("*.lmkv")) - n_before
        return path


def shared_metric(url: str, name: str, **labels: str) -> float:
    headers = {"authorization": f"Bearer {ADMIN[0]}"}
    r = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    assert r.status_code == 200, r.text
    text = r.text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("shared-tier")
    folder = root / "shared"
    data_one = root / "data-one"
    store = TokenStore(data_one)
    try:
        tokens = {who: store.create(parse_scopes("models:read,responses:write"), who)[0] for who in ("alice", "bob")}
        ADMIN[:] = [store.create(parse_scopes("admin"), "ops")[0]]
    finally:
        store.close()
    model = embedded_model_path()
    digest = ContentDigest(model, data_one)
    digest._write_memo(file_key(model), _sha256(model))
    data_two = root / "data-two"
    shutil.copytree(data_one, data_two)  # the same tokens, hence the same owners, on both
    common = ("--parallel", "1", "--keep-alive", "-1", "--no-discover", "--cache-ram", "0")
    common += ("--cache-shared", str(folder), "--cache-shared-bytes", str(BUDGET))
    one = start_server(root, *common, "--data-dir", str(data_one))
    try:
        two = start_server(root, *common, "--data-dir", str(data_two))
    except BaseException:
        one.stop()
        raise
    yield Pair(one, two, tokens, folder)
    one.stop()
    two.stop()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_a_next_turn_on_another_server_restores_its_past_and_answers_the_same(pair):
    messages = pair.turn_one(0)
    hits = shared_metric(pair.two.url, "lmsp_prompt_cache_shared_lookups_total", result="hit")
    on_two, cached = pair.chat(pair.two, "alice", messages)
    assert cached > 100
    assert shared_metric(pair.two.url, "lmsp_prompt_cache_shared_lookups_total", result="hit") == hits + 1
    # The reference: server one's slot kept the first turn (one slot, nothing else ran there).
    on_one, kept = pair.chat(pair.one, "alice", messages)
    assert kept >= cached
    assert on_two == on_one


def test_another_owner_never_restores_a_state(pair):
    messages = pair.turn_one(1, who="alice")
    _, cached = pair.chat(pair.two, "bob", messages)
    assert cached == 0
    _, cached = pair.chat(pair.two, "alice", messages, cache_salt="tenant-1")  # nor another salt
    assert cached == 0
    _, cached = pair.chat(pair.two, "alice", messages)
    assert cached > 100


@pytest.mark.parametrize("damage", ["state", "truncated", "other-model"])
def test_a_damaged_or_foreign_file_is_refused_and_the_answer_is_a_fresh_reads(pair, damage):
    before = pair.settled_files()  # the earlier tests' last writes have landed: not taken for ours
    messages = pair.turn_one(2 + ("state", "truncated", "other-model").index(damage))
    path = pair.file_of(before)
    raw = bytearray(path.read_bytes())
    n_header = int.from_bytes(raw[12:16], "little")
    if damage == "state":
        raw[-1000] ^= 0xFF
    elif damage == "truncated":
        raw = raw[: len(raw) // 2]
    else:  # the same length of header, another model's digest
        header = orjson.loads(raw[FIXED.size : FIXED.size + n_header])
        digest = header["model"][7:71]
        header["model"] = header["model"].replace(digest, "0" * 64)
        raw[FIXED.size : FIXED.size + n_header] = orjson.dumps(header)
    path.write_bytes(bytes(raw))
    refused = shared_metric(pair.two.url, "lmsp_prompt_cache_shared_refused_total")
    # Server two's one slot is another owner's: nothing of this prompt is kept but what the
    # shared tier would give, so its whole prompt is read in one pass, as the reference's.
    pair.chat(pair.two, "bob", [{"role": "user", "content": "Hello."}], max_tokens=1)
    text, cached = pair.chat(pair.two, "alice", messages)
    assert cached == 0
    if damage == "other-model":  # not ours to judge: left for the server it belongs to
        assert path.exists()
    else:
        assert not path.exists()
        assert shared_metric(pair.two.url, "lmsp_prompt_cache_shared_refused_total") == refused + 1
    # What a read from scratch gives: the same request in a scope that has nothing cached.
    fresh, none = pair.chat(pair.two, "alice", messages, cache_salt=f"fresh-{damage}")
    assert none == 0
    assert text == fresh


def test_the_folder_keeps_its_byte_budget(pair):
    for i in range(10, 15):
        pair.turn_one(i)
    sizes = [p.stat().st_size for p in pair.folder.rglob("*.lmkv")]
    assert sum(sizes) <= BUDGET
    evicted = sum(shared_metric(s.url, "lmsp_prompt_cache_shared_evictions_total") for s in (pair.one, pair.two))
    assert evicted >= 1
    assert shared_metric(pair.one.url, "lmsp_prompt_cache_bytes", tier="shared") == pytest.approx(sum(sizes))
