"""The site's generated reference tables (docs/hooks/reference.py) say what the code says:
every option `lmsp serve --help` prints, with its variable; every error code with its status;
every event; and every page's marker names a table that exists."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path
from types import ModuleType
from unittest import mock

import pytest

from lmsp.cli import main
from lmsp.protocol.errors import CODES
from lmsp.protocol.events import EVENT_DATA, FINAL_EVENTS

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", ROOT / "docs" / "hooks" / "reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _help(*command: str) -> str:
    """What `lmsp COMMAND --help` prints: `serve`'s from the real command line, the others from
    `lmsp.cli.main` in this process (the same parser, without a second interpreter's start-up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSP_")}
    env["COLUMNS"] = "200"  # one option a line, its help beside it
    if command == ("serve",):
        done = subprocess.run(
            [sys.executable, "-m", "lmsp", *command, "--help"], capture_output=True, text=True, env=env, check=True
        )
        return done.stdout
    out = io.StringIO()
    with mock.patch.dict(os.environ, env, clear=True), redirect_stdout(out), pytest.raises(SystemExit):
        main([*command, "--help"])
    return out.getvalue()


def _options(help_text: str) -> dict[str, str | None]:
    """--flag → the variable `--help` names for it (None where it names none)."""
    found: dict[str, str | None] = {}
    text = help_text.split("options:", 1)[1]
    # An option's entry runs from its line to the next line that starts with an option.
    entries = re.split(r"\n(?=\s{2}-)", text)
    for entry in entries:
        flag = re.match(r"\s*(?:-\w, )?(--[a-z0-9-]+)", entry)
        if flag is None or flag.group(1) == "--help":
            continue
        var = re.search(r"\[env ([A-Z0-9_]+)\]", re.sub(r"\s+", " ", entry))
        found[flag.group(1)] = var.group(1) if var else None
    return found


def _rows(table: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in table.splitlines() if line.startswith("| ")]


def test_the_serve_options_table_is_serve_help(reference: ModuleType) -> None:
    shown = _options(_help("serve"))
    assert len(shown) > 20, "the help parser found too few options"
    table = {row[0].split("`")[1]: row for row in _rows(reference.settings_page())[2:]}
    assert set(table) == set(shown), (
        f"in --help only: {set(shown) - set(table)}; in the page only: {set(table) - set(shown)}"
    )
    for flag, var in shown.items():
        assert var is not None, f"{flag}: serve --help names no variable"
        assert table[flag][2] == f"`{var}`", f"{flag}: the page says {table[flag][2]}, --help says {var}"
    environment = reference.environment_page()
    for flag, var in shown.items():
        assert f"| `{var}` | `{flag}` |" in environment, f"{var} ({flag}) is missing from the configuration page"


def test_the_cli_page_has_every_command_and_option(reference: ModuleType) -> None:
    page = reference.cli_page()
    for command in ("serve", "run", "models", "doctor", "token create", "token list", "token revoke"):
        assert f"## `lmsp {command}`" in page, command
        for flag in _options(_help(*command.split())):
            assert f"`{flag}`" in page.split(f"## `lmsp {command}`", 1)[1].split("\n## ", 1)[0], (command, flag)


def test_the_error_table_is_the_registry(reference: ModuleType) -> None:
    rows = _rows(reference.errors_page())[2:]
    table = {row[1].strip("`"): int(row[0]) for row in rows}
    assert table == {code: status for code, (status, _title) in CODES.items()}


def test_the_event_table_is_the_protocol(reference: ModuleType) -> None:
    rows = _rows(reference.events_page())[2:]
    assert [row[0].strip("`") for row in rows] == list(EVENT_DATA)
    for row in rows:
        name = row[0].strip("`")
        assert (row[2] == "yes") == (name in FINAL_EVENTS), name
        for field in EVENT_DATA[name]["fields"]:  # type: ignore[index]
            assert f"`{field}`" in row[1], (name, field)


def test_every_marker_names_a_table_and_every_table_has_a_page(reference: ModuleType) -> None:
    used = set()
    for page in sorted((ROOT / "docs").rglob("*.md")):
        for name in reference.MARKER.findall(page.read_text(encoding="utf-8")):
            assert name in reference.GENERATORS, f"{page.relative_to(ROOT)}: no table named {name!r}"
            used.add(name)
    assert used == set(reference.GENERATORS), f"tables no page shows: {set(reference.GENERATORS) - used}"
