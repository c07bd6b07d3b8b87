"""The real Codex CLI (`openai-codex-cli-bin`, the binary OpenAI publishes on PyPI) driving a
real server on the real model through `/v1/responses`, as a user would configure it: a
`model_providers` entry with `wire_api = "responses"`. What Codex sends is its own (its
function tools, a `namespace` of sub-agent tools, `web_search`, `reasoning`, `include`,
`client_metadata`, `store: false`, `prompt_cache_key`); only its long built-in instructions
are swapped for a short file, as its `model_instructions_file` setting allows, because the
embedded model's window (8,192 tokens) is smaller than Codex's default prompt."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import codex_cli_bin
import orjson

from helpers import MODEL

# What Codex would otherwise add to every prompt beyond the embedded model's window.
_SMALLER = ("features.goals=false", "features.multi_agent=false", "features.skill_search=false")


def _codex(server_url: str, tmp_path: Path, prompt: str) -> list[dict]:
    home = tmp_path / "codex-home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
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
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-4000:]
    return [orjson.loads(line) for line in done.stdout.splitlines() if line.startswith(b"{")]


def test_a_codex_turn_completes_through_the_openai_face(server, tmp_path):
    events = _codex(server.url, tmp_path, "Say hello.")
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
