"""The prompt cache beyond the slots (engine/prompt_cache.py, docs/operations/prompt-cache.md):
more conversations than slots, each turn sending the whole history. A conversation whose slot
was taken since its last turn gets its past restored from host memory (or, after a restart,
from disk), and its greedy output is byte-identical to a service with a slot for every
conversation, whose slots keep their past; `cached_tokens` counts what was restored, and the
metrics count the hits. The conversations run at more than one `--batch-size`
(LMSP_TEST_CACHE_BATCH_SIZES), and a restored state is checked at the engine: the cells it
gives back are the saved ones, byte for byte, and the next token's logits are the kept slot's.

The reference keeps its slots rather than decoding every history from scratch: llama.cpp's CPU
kernels round differently when a prompt is read in one pass or in pieces (or a past token by
token, as the replies were), so a past decoded token by token and the same past read as one
prompt can differ in the last bits, and a greedy choice between two near-equal tokens with them.
A restore gives back the very cells the slot held, so it must match the kept slot exactly.

The runs send one request at a time. Two at once change what llama.cpp decodes together, with
the cache or without it (two prompts of different lengths in one step: llama.cpp reads the
longer in two passes), and pairs on 2 slots gave another third reply in one of 5 conversations;
the same pairs with every sequence decoded in a llama_decode of its own, the same restores
included, matched the reference (docs/operations/prompt-cache.md, "Exactness")."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import MODEL, checked_client, make_token
from lmsp.engine.llama import Batch, Context, ContextConfig, LlamaModel
from lmsp.engine.prompt_cache import PromptCache
from lmsp.engine.prompt_disk import MAGIC, scope_owner
from lmsp.engine.registry import embedded_model_path
from lmsp.security.scopes import parse_scopes
from lmsp.service.responses import cache_owner_key
from lmsp.testing import RunningServer, start_server, worker_threads
from lmsp.tokens.sqlite import TokenStore

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
# 5 on 2 slots makes every later turn miss its slot; LMSP_TEST_CACHE_CONVERSATIONS and
# LMSP_TEST_CACHE_TURNS size a lighter run (a loaded machine) or a heavier one.
CONVERSATIONS = int(os.environ.get("LMSP_TEST_CACHE_CONVERSATIONS", "5"))
TURNS = min(3, int(os.environ.get("LMSP_TEST_CACHE_TURNS", "3")))
# Requests at once in each round of turns: one at a time, as the reference (the module's note).
TOGETHER = (1, 1, 1)
# `--batch-size` of each run: the default, and one that reads every preamble in several passes.
BATCH_SIZES = tuple(int(b) for b in os.environ.get("LMSP_TEST_CACHE_BATCH_SIZES", "512,48").split(","))
TOPICS = ("lighthouses", "bread baking", "glaciers", "chess openings", "honey bees", "tidal power", "origami")
QUESTIONS = ("Tell me one fact.", "Why does it matter?", "Say it in five words.")


def preamble(i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return (
        f"You are a patient guide to {topic} (conversation {i}). "
        + f"Answer briefly and plainly about {topic}, with one concrete example each time. " * 6
    )


def start_pair(tmp_path_factory: pytest.TempPathFactory, batch_size: int) -> tuple[RunningServer, RunningServer]:
    """A 2-slot server with the cache, and a cache-off reference with a slot per conversation."""
    common = ("--parallel", "2", "--keep-alive", "-1", "--no-discover", "--batch-size", str(batch_size))
    cached = start_server(tmp_path_factory.mktemp("cache-on"), *common, "--cache-ram", "256")
    try:
        fresh = start_server(
            tmp_path_factory.mktemp("cache-off"),
            *common,
            "--cache-ram",
            "0",
            "--parallel",  # the last --parallel wins: a slot for every conversation
            str(CONVERSATIONS + 1),
            "--ctx-size",
            "2048",
        )
    except BaseException:
        cached.stop()
        raise
    return cached, fresh


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, RunningServer]]:
    cached, fresh = start_pair(tmp_path_factory, BATCH_SIZES[0])
    yield cached, fresh
    cached.stop()
    fresh.stop()


@pytest.fixture(scope="module", params=BATCH_SIZES, ids=lambda b: f"batch-{b}")
def batch_servers(request: pytest.FixtureRequest) -> Iterator[tuple[RunningServer, RunningServer]]:
    if request.param == BATCH_SIZES[0]:
        yield request.getfixturevalue("servers")
        return
    cached, fresh = start_pair(request.getfixturevalue("tmp_path_factory"), request.param)
    yield cached, fresh
    cached.stop()
    fresh.stop()


def chat(client: httpx.Client, messages: list[dict[str, str]]) -> tuple[str, int, int]:
    r = client.post(CHAT, json={"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 16})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    usage = data["usage"]
    return (
        data["choices"][0]["message"]["content"],
        usage["prompt_tokens"],
        usage["prompt_tokens_details"]["cached_tokens"],
    )


def scrape(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    return {
        s.name + "".join(f",{k}={v}" for k, v in sorted(s.labels.items()) if k != "model"): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if family.name.startswith("lmsp_prompt_cache") or family.name == "lmsp_prompt_tokens"
    }


def run(url: str, together: tuple[int, ...]) -> tuple[list[list[str]], list[list[tuple[int, int]]]]:
    """Every conversation's turns, round by round, `together[turn]` requests at once."""
    histories = [[{"role": "system", "content": preamble(i)}] for i in range(CONVERSATIONS)]
    replies: list[list[str]] = [[] for _ in range(CONVERSATIONS)]
    usage: list[list[tuple[int, int]]] = [[] for _ in range(CONVERSATIONS)]
    with checked_client(url) as client, ThreadPoolExecutor(2) as pool:
        for turn in range(TURNS):
            for history in histories:
                history.append({"role": "user", "content": QUESTIONS[turn]})
            if together[turn] == 1:
                answers = [chat(client, h) for h in histories]
            else:
                answers = list(pool.map(lambda h: chat(client, h), histories))
            for i, (text, prompt_tokens, cached_tokens) in enumerate(answers):
                histories[i].append({"role": "assistant", "content": text})
                replies[i].append(text)
                usage[i].append((prompt_tokens, cached_tokens))
    return replies, usage


def test_restored_prefixes_give_the_output_a_fresh_decode_gives(batch_servers):
    cached, fresh = batch_servers
    expected, fresh_usage = run(fresh.url, together=(1, 1, 1))
    before = scrape(cached.url)
    replies, usage = run(cached.url, together=TOGETHER)
    assert replies == expected
    for turns in usage:
        for prompt_tokens, cached_tokens in turns[1:]:
            # The conversation's slot went to others since its last turn; its past came
            # back from the cache: all but the new user message and the template's frame.
            assert cached_tokens >= prompt_tokens - 40, turns
    after = scrape(cached.url)
    later_turns = (CONVERSATIONS - 2) * (TURNS - 1)  # the last two may still find their slot
    assert (
        after["lmsp_prompt_cache_lookups_total,result=hit"]
        - before.get("lmsp_prompt_cache_lookups_total,result=hit", 0)
        >= later_turns
    )
    assert after["lmsp_prompt_cache_restored_tokens_total"] > before.get("lmsp_prompt_cache_restored_tokens_total", 0)
    assert after["lmsp_prompt_cache_restore_seconds_total"] > 0
    assert 0 < after["lmsp_prompt_cache_bytes,tier=ram"] <= 256 * 1024 * 1024
    assert after["lmsp_prompt_cache_entries"] >= CONVERSATIONS - 2
    # The reference kept every conversation in its slot: the cache gave back just as much.
    assert [turns[1:] for turns in usage] == [turns[1:] for turns in fresh_usage]
    off = scrape(fresh.url)
    assert off["lmsp_prompt_cache_lookups_total,result=hit"] == 0
    assert off["lmsp_prompt_cache_bytes,tier=ram"] == 0


def respond(client: httpx.Client, text: str, previous: str | None = None, conversation: int = 99) -> dict[str, Any]:
    # Instructions are not carried over from a previous response: each request sends them.
    payload: dict[str, Any] = {
        "model": MODEL,
        "input": text,
        "instructions": preamble(conversation),
        "temperature": 0,
        "max_output_tokens": 8,
    }
    if previous is not None:
        payload["previous_response_id"] = previous
    r = client.post(RESPONSES, json=payload)
    assert r.status_code == 200, r.text
    result: dict[str, Any] = r.json()
    return result


def test_responses_count_restored_tokens_as_cached(servers):
    cached, _ = servers
    with checked_client(cached.url) as client:
        first = respond(client, "Tell me one fact.")
        # Two other conversations take both slots.
        for i in (97, 98):
            chat(client, [{"role": "system", "content": preamble(i)}, {"role": "user", "content": "Hello."}])
        second = respond(client, "Why does it matter?", previous=first["id"])
    details = second["usage"]["input_tokens_details"]
    assert details["cached_tokens"] >= first["usage"]["input_tokens"] - 8, second["usage"]


def text_of(response: dict[str, Any]) -> str:
    return "".join(c["text"] for item in response["output"] for c in item.get("content", []) if "text" in c)


def test_a_conversation_restores_from_disk_after_a_restart(tmp_path, servers):
    _, fresh = servers
    cache_dir = tmp_path / "kv"
    args = ("--parallel", "1", "--keep-alive", "-1", "--no-discover", "--cache-ram", "64")
    args += ("--data-dir", str(tmp_path / "data"), "--cache-dir", str(cache_dir))

    def turn(text: str, previous: str | None) -> tuple[dict[str, Any], dict[str, float]]:
        server = start_server(tmp_path, *args)
        try:
            with checked_client(server.url) as client:
                result = respond(client, text, previous, conversation=42)
            return result, scrape(server.url)
        finally:
            server.stop()  # unloading writes the slot's state to disk

    with checked_client(fresh.url) as client:
        expected = [respond(client, "Tell me one fact.", conversation=42)]
        for text in ("Why does it matter?", "Say it in five words."):
            expected.append(respond(client, text, expected[-1]["id"], conversation=42))

    first, _ = turn("Tell me one fact.", None)
    assert text_of(first) == text_of(expected[0])
    files = list(cache_dir.rglob("*.lmkv"))
    assert len(files) == 1
    (files[0].parent / "not-ours.lmkv").write_bytes(b"something else entirely")

    second, metrics = turn("Why does it matter?", first["id"])
    assert text_of(second) == text_of(expected[1])
    assert second["usage"]["input_tokens_details"]["cached_tokens"] >= first["usage"]["input_tokens"] - 8
    assert metrics["lmsp_prompt_cache_lookups_total,result=hit"] == 1
    assert metrics["lmsp_prompt_cache_bytes,tier=disk"] > 0

    # A damaged state is found out by its checksum and never loaded: the prompt is read afresh
    # (its output may differ from the kept slot's in the last bits: see the module's note).
    for saved in cache_dir.rglob("*.lmkv"):
        if saved.name != "not-ours.lmkv":
            raw = bytearray(saved.read_bytes())
            raw[-100] ^= 0xFF
            saved.write_bytes(raw)
    third, metrics = turn("Say it in five words.", second["id"])
    # Read afresh, its reply may run to the output limit where the kept slot's stopped.
    assert third["status"] in ("completed", "incomplete") and text_of(third)
    assert third["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert metrics["lmsp_prompt_cache_lookups_total,result=hit"] == 0
    assert (files[0].parent / "not-ours.lmkv").exists()  # not ours: left alone


@pytest.mark.parametrize("batch_size", BATCH_SIZES, ids=lambda b: f"batch-{b}")
def test_a_restore_gives_back_the_saved_cells_and_the_kept_slots_logits(batch_size):
    """At the engine, no server: a history of a prompt and a greedy reply is saved, its slot
    reused, and the state restored (into the slot it came from, and into another): the cells
    are the saved ones, byte for byte, and the next prompt's logits are the kept slot's, bit
    for bit, also when the next prompt keeps only part of the reply (its end re-tokenized)."""
    path = embedded_model_path()
    assert path is not None
    model = LlamaModel(path)
    ctx = Context(model, ContextConfig(n_ctx=2 * 512, n_seq_max=2, n_batch=batch_size, n_threads=worker_threads()))
    batch = Batch(batch_size)

    def feed(seq: int, tokens: list[int], start: int) -> bytes:
        """Decodes `tokens` from position `start` in passes of `batch_size`; the last one's logits."""
        for at in range(0, len(tokens), batch_size):
            batch.clear()
            for k, token in enumerate(tokens[at : at + batch_size]):
                index = batch.add(token, start + at + k, seq, at + k == len(tokens) - 1)
            assert ctx.decode(batch) == 0
        return ctypes.string_at(ctx.logits_address(index), 4 * model.n_vocab)

    def argmax(logits: bytes) -> int:
        values = memoryview(logits).cast("f")
        return max(range(len(values)), key=values.__getitem__)

    def history() -> list[int]:
        ctx.forget(0)
        tokens = model.tokenize(preamble(0), add_special=True)
        logits = feed(0, tokens, 0)
        for _ in range(6):  # the reply, token by token
            tokens.append(argmax(logits))
            logits = feed(0, tokens[-1:], len(tokens) - 1)
        return tokens

    follow = model.tokenize(" Why does it matter? Say it in five words.", add_special=False)
    try:
        for dropped in (0, 2):
            tokens = history()
            keep = len(tokens) - dropped
            ctx.forget(0, keep)
            kept = feed(0, follow, keep)
            tokens = history()
            cache = PromptCache(64 * 1024 * 1024)
            assert cache.save(ctx, 0, tokens)
            saved = ctx.save_state(0)
            ctx.forget(0)
            feed(0, model.tokenize(preamble(1), add_special=True), 0)  # another conversation takes the slot
            entry, shared = cache.lookup(tokens[:keep] + follow)
            assert entry is not None and shared == keep
            assert cache.restore(ctx, entry, 0)
            assert ctx.save_state(0) == saved
            ctx.forget(0, keep)
            assert feed(0, follow, keep) == kept
            # Into the other slot: llama.cpp's state names the sequence's cache, so the bytes
            # differ there; carried back, they are the saved ones again.
            assert cache.restore(ctx, entry, 1)
            moved = ctx.save_state(1)
            assert moved is not None
            ctx.forget(1, keep)
            assert feed(1, follow, keep) == kept
            ctx.forget(0)
            assert ctx.load_state(0, moved)
            assert ctx.save_state(0) == saved
            ctx.forget(1)
    finally:
        batch.close()
        ctx.close()
        model.close()


def test_one_owners_prompt_is_never_anothers_cache_hit(tmp_path):
    """Issue 38, the prompt-prefix oracle: slots, a slot's copy and the memory tier are matched
    within one owner, so `cached_tokens` (and the time to the first token) tell a token nothing
    of another owner's prompts, nor of the same owner's under another `cache_salt`.
    `--cache-scope shared` is the operator's opt-in to share."""
    data_dir = tmp_path / "data"
    tokens = {
        who: make_token(data_dir, "models:read,responses:write", who) for who in ("alice", "bob", "carol", "dave")
    }
    messages = [{"role": "system", "content": preamble(5)}, {"role": "user", "content": "Tell me one fact."}]
    args = ("--parallel", "2", "--keep-alive", "-1", "--no-discover", "--cache-ram", "64", "--data-dir", str(data_dir))

    def ask(server: RunningServer, who: str, **extra: str) -> tuple[int, int]:
        payload = {"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 2, **extra}
        with checked_client(server.url) as c:
            c.headers["authorization"] = f"Bearer {tokens[who]}"
            r = c.post(CHAT, json=payload)
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return usage["prompt_tokens"], usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)

    server = start_server(tmp_path, *args)
    try:
        n, cached = ask(server, "alice")
        assert n > 100 and cached == 0
        # Alice's cells are in slot 0: bob neither reuses that slot nor copies it.
        assert ask(server, "bob")[1] == 0
        assert ask(server, "bob")[1] >= n - 8  # his own slot is his
        # Carol takes alice's slot (alice's cells go to memory), dave bob's (bob's too): neither
        # a slot nor the memory tier gives them anything of another owner's.
        assert ask(server, "carol")[1] == 0
        assert ask(server, "dave")[1] == 0
        # Alice's own state comes back from memory.
        assert ask(server, "alice")[1] >= n - 8
        # A `cache_salt` is a scope of its own within the owner.
        assert ask(server, "alice", cache_salt="tenant-1")[1] == 0
        assert ask(server, "alice", cache_salt="tenant-1")[1] >= n - 8
    finally:
        server.stop()

    shared = start_server(tmp_path, *args, "--cache-scope", "shared")
    try:
        assert ask(shared, "alice")[1] == 0
        assert ask(shared, "bob")[1] >= n - 8
    finally:
        shared.stop()


def _owner_token(data_dir: Path, name: str) -> tuple[str, str]:
    """A token's secret and its owner's cache key (what its prompts' disk files name)."""
    tokens = TokenStore(data_dir)
    try:
        secret, info = tokens.create(parse_scopes("models:read,responses:read,responses:write"), name)
    finally:
        tokens.close()
    return secret, cache_owner_key(info.owner)


def _file_owners(cache_dir: Path) -> list[str]:
    """The owner key of each saved state under the cache folder, read from its header."""
    owners = []
    for path in cache_dir.rglob("*.lmkv"):
        raw = path.read_bytes()
        assert raw.startswith(MAGIC)
        n_header = int.from_bytes(raw[12:16], "little")
        owners.append(scope_owner(orjson.loads(raw[16 : 16 + n_header])["scope"]))
    return owners


def test_a_delete_drops_its_owners_prompt_states_from_slot_memory_and_disk(tmp_path):
    """Issue 38, deletion reaches every copy: no cached state names the response it served, so a
    DELETE by an owner drops every state of that owner: the slots' cells, the memory tier and
    the disk tier's files. Alice's next identical prompt is read afresh; Bob's states stay."""
    data_dir, cache_dir = tmp_path / "data", tmp_path / "kv"
    alice, alice_key = _owner_token(data_dir, "alice")
    bob, bob_key = _owner_token(data_dir, "bob")
    args = ("--parallel", "1", "--keep-alive", "-1", "--no-discover", "--cache-ram", "64")
    args += ("--data-dir", str(data_dir), "--cache-dir", str(cache_dir))
    payload = {"model": MODEL, "input": "Tell me one fact.", "instructions": preamble(7), "temperature": 0}
    payload |= {"max_output_tokens": 8, "store": True}

    def ask(server: RunningServer, token: str) -> tuple[str, int, int]:
        with checked_client(server.url) as c:
            c.headers["authorization"] = f"Bearer {token}"
            r = c.post(RESPONSES, json=payload)
        assert r.status_code == 200, r.text
        body = r.json()
        return body["id"], body["usage"]["input_tokens"], body["usage"]["input_tokens_details"]["cached_tokens"]

    # A first server: both prompts read afresh, their states written to disk at shutdown.
    server = start_server(tmp_path, *args)
    try:
        stored, n, cached = ask(server, alice)
        assert n > 100 and cached == 0
        assert ask(server, bob)[2] == 0  # alice's slot is taken: hers goes to memory
    finally:
        server.stop()
    assert sorted(_file_owners(cache_dir)) == sorted([alice_key, bob_key])

    server = start_server(tmp_path, *args)
    try:
        # Each state existed: restored from disk, then held in memory and in the one slot.
        assert ask(server, alice)[2] >= n - 8
        assert ask(server, bob)[2] >= n - 8
        assert ask(server, alice)[2] >= n - 8  # alice's again in the slot, bob's in memory
        with checked_client(server.url) as c:
            c.headers["authorization"] = f"Bearer {alice}"
            r = c.delete(f"{RESPONSES}/{stored}")
            assert r.status_code == 200 and r.json()["deleted"] is True, r.text
            assert c.get(f"{RESPONSES}/{stored}").status_code == 404
        # Before the answer: no file of hers is left, bob's is.
        assert _file_owners(cache_dir) == [bob_key]
        # Nothing of hers is found anywhere: read afresh. Bob's state is still his.
        assert ask(server, alice)[2] == 0
        assert ask(server, bob)[2] >= n - 8
    finally:
        server.stop()
