"""The real Codex CLI (`openai-codex-cli-bin`, the binary OpenAI publishes on PyPI) driving a
real server on the real model through `/v1/responses`, as a user would configure it: a
`model_providers` entry with `wire_api = "responses"`. What Codex sends is its own (its
function tools, a `namespace` of sub-agent tools, `web_search`, `reasoning`, `include`,
`client_metadata`, `store: false`, `prompt_cache_key`); only its long built-in instructions
are swapped for a short file, as its `model_instructions_file` setting allows, because the
embedded model's window (8,192 tokens) is smaller than Codex's default prompt.

Codex sends no temperature, so the model samples at 1 and may ramble until its window is
full: the service ends that response `incomplete` (context_length), as it must, and Codex
fails the turn. Such a try is allowed, and only such; the server has its own small window
(and its own KV cache, so no other test sees Codex's prompt in a slot) to keep it short."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import codex_cli_bin
import orjson
import pytest

from helpers import MODEL
from lmsp.testing import RunningServer, start_server

# What Codex would otherwise add to every prompt beyond the embedded model's window.
_SMALLER = ("features.goals=false", "features.multi_agent=false", "features.skill_search=false")
TRIES = 5
# What Codex says when a response ended because the model filled its window.
_RAMBLED = "Incomplete response returned, reason: context_length"


@pytest.fixture(scope="module")
def codex_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    # Codex's prompt here is about 1,800 tokens: room for its answer, not for a long ramble.
    srv = start_server(tmp_path_factory.mktemp("codex"), "--ctx-size", "2560", "--parallel", "1", "--keep-alive", "-1")
    yield srv
    srv.stop()


def _codex(server_url: str, tmp_path: Path, prompt: str) -> list[dict]:
    home = tmp_path / "codex-home"
    work = tmp_path / "work"
    home.mkdir(exist_ok=True)
    work.mkdir(exist_ok=True)
    (home / "config.toml").write_text(
        f'model = "{MODEL}"\nmodel_provider = "lmsp"\n\n'
        f'[model_providers.lmsp]\nname = "lmsp"\nbase_url = "{server_url}/v1"\nwire_api = "responses"\n'
    )
    instructions = tmp_path / "instructions.md"
    instructions.write_text("You are a helpful assistant in a terminal. Answer briefly.\n")
    overrides = [arg for setting in (f"model_instructions_file={instructions}", *_SMALLER) for arg in ("-c", setting)]
    done = subprocess.run(
        [str(codex_cli_bin.bundled_codex_path()), "exec", "--json", "--skip-git-repo-check", *overrides, prompt],
        cwd=work,
        env={**os.environ, "CODEX_HOME": str(home)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=240,
    )
    events = [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith(b"{")]
    failed = [e for e in events if e["type"] == "turn.failed"]
    assert (done.returncode == 0) == (not failed), (done.stdout + done.stderr).decode(errors="replace")[-4000:]
    return events


def test_a_codex_turn_completes_through_the_openai_face(codex_server, tmp_path):
    for _ in range(TRIES):
        events = _codex(codex_server.url, tmp_path, "Say hello.")
        if events[-1]["type"] != "turn.failed":
            break
        assert events[-1]["error"]["message"] == _RAMBLED, events[-1]  # the model's length, nothing else
    kinds = [e["type"] for e in events]
    assert kinds[0] == "thread.started" and "turn.started" in kinds and kinds[-1] == "turn.completed", kinds
    assert "turn.failed" not in kinds and "error" not in kinds
    items = [e["item"] for e in events if e["type"] == "item.completed"]
    # Codex warns that it has no metadata for a model it does not know; nothing else fails.
    errors = [i["message"] for i in items if i["type"] == "error"]
    assert all("Model metadata" in message for message in errors), errors
    answers = [i for i in items if i["type"] == "agent_message"]
    assert answers and all(a["text"].strip() for a in answers)
    usage = events[-1]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
