"""Every `sh`, `console` and `python` example in README.md and docs/ runs against a real
`lmsp serve` on the real model, so the documentation cannot rot.

The conventions (docs/contributing/docs.md says them for writers):
- Examples use the default address, `localhost:8750` or `127.0.0.1:8750`; the runner puts the
  test server's port there, and sets `LMSP_BASE_URL` (read by `lmsp run`, `lmsp models` and
  `lmsp.Client`) to it. Each runs in a fresh folder with a fresh `LMSP_HOME`.
- An example that cannot run here says so on the line before its fence:
  `<!-- example: skip — why -->`; it is reported as a pytest skip with that reason. An example
  expected to fail says `<!-- example: exit N -->`. Nothing else is skipped.
- Checks: the exit status; something printed; and, when the block right after the example
  (blank lines between, nothing else) shows its output, the shape of that output: a JSON
  object's keys (and its `object` and `code`), an HTTP status line's code, an event stream's
  event names and final event. A `console` block's commands are its `$ ` lines, and the last
  line it shows must appear in what they print.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lmsp.testing import RunningServer

ROOT = Path(__file__).resolve().parents[2]
RUNNABLE = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "console", "python": "python", "py": "python"}
FENCE = re.compile(r"^(`{3,})([\w+-]*)\s*$")
MARKER = re.compile(r"^<!-- example: (?P<what>skip|exit)\b\s*(?:[—:-]\s*)?(?P<rest>.*?)\s*-->$")
DEFAULT_ADDRESS = re.compile(r"\b(?:localhost|127\.0\.0\.1):8750\b")
TIMEOUT = float(os.environ.get("LMSP_DOCS_EXAMPLE_TIMEOUT", "180"))

pytestmark = pytest.mark.model


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # the fence's line, 1-based
    lang: str
    code: str
    marker: tuple[str, str] | None  # ("skip", reason) or ("exit", "N")
    shown: tuple[str, str] | None  # the output block that follows: (lang, text)

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}"


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [f for f in files if "hooks" not in f.relative_to(ROOT).parts]


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of one Markdown file, runnable or not, each with the marker on the
    line before it and the output block right after it."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[tuple[int, str, str, str | None]] = []  # (line, lang, code, line before)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, lang, start = m.group(1), m.group(2).lower(), i
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == ticks), len(lines))
        before = lines[start - 1].strip() if start > 0 else None
        found.append((start, lang, "\n".join(lines[start + 1 : end]), before))
        i = end + 1
    rel = path.relative_to(ROOT).as_posix()
    out = []
    for k, (start, lang, code, before) in enumerate(found):
        marker = None
        if before and (mm := MARKER.match(before)):
            marker = (mm["what"], mm["rest"])
        elif before and before.startswith("<!-- example"):
            raise AssertionError(f"{rel}:{start + 1}: unreadable example marker {before!r}")
        shown = None
        if k + 1 < len(found):
            nxt_start, nxt_lang, nxt_code, _ = found[k + 1]
            end_of_this = start + code.count("\n") + 3  # past the closing fence
            between = lines[end_of_this:nxt_start]
            if all(not line.strip() for line in between) and nxt_lang not in RUNNABLE:
                shown = (nxt_lang, nxt_code)
        out.append(Block(rel, start + 1, lang, code, marker, shown))
    return out


def runnable() -> list[Block]:
    return [b for f in doc_files() for b in blocks(f) if b.lang in RUNNABLE]


EXAMPLES = runnable()


# --- shapes -----------------------------------------------------------------------------------


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _http(text: str) -> tuple[int, str] | None:
    """(status, body) of `curl -i` output."""
    m = re.match(r"HTTP/[\d.]+ (\d{3})[^\n]*\n(.*?)\r?\n\r?\n(.*)", text.replace("\r\n", "\n"), re.S)
    return (int(m.group(1)), m.group(3)) if m else None


def _events(text: str) -> list[str]:
    return re.findall(r"^event: ?(\S+)", text, re.M)


def check_shape(shown: str, actual: str, name: str) -> None:
    """What the page shows and what ran have the same shape (model text may differ)."""
    shown_http, actual_http = _http(shown), _http(actual)
    if shown_http is not None:
        assert actual_http is not None, f"{name}: the page shows an HTTP answer, the example printed:\n{actual}"
        assert actual_http[0] == shown_http[0], f"{name}: status {actual_http[0]}, the page shows {shown_http[0]}"
        shown, actual = shown_http[1], actual_http[1]
    if _events(shown):
        got = _events(actual)
        assert got, f"{name}: the page shows an event stream, the example printed:\n{actual}"
        assert got[-1] == _events(shown)[-1], f"{name}: the stream ended {got[-1]}, the page shows {_events(shown)[-1]}"
        missing = set(_events(shown)) - set(got)
        assert not missing, f"{name}: events the page shows and the stream lacked: {missing}"
        return
    doc = _json(shown)
    if isinstance(doc, dict):
        got = _json(actual)
        assert isinstance(got, dict), f"{name}: the page shows a JSON object, the example printed:\n{actual}"
        assert set(doc) <= set(got), f"{name}: keys the page shows and the answer lacks: {set(doc) - set(got)}"
        for key in ("object", "code"):
            if key in doc:
                assert got[key] == doc[key], f"{name}: {key} {got[key]!r}, the page shows {doc[key]!r}"


# --- running ----------------------------------------------------------------------------------


def _env(server: RunningServer, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LMSP_")}
    bin_dir = str(Path(sys.executable).parent)
    return {
        **env,
        "PATH": bin_dir + os.pathsep + env.get("PATH", ""),
        "LMSP_BASE_URL": server.url,
        "LMSP_HOME": str(home),
        "PYTHONUNBUFFERED": "1",
    }


def _run(args: list[str], cwd: Path, env: dict[str, str], name: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: still running after {TIMEOUT:.0f} s (a long-running example needs a skip marker)")


@pytest.mark.parametrize("example", EXAMPLES, ids=[b.name for b in EXAMPLES])
def test_example(example: Block, server: RunningServer, tmp_path: Path) -> None:
    if example.marker and example.marker[0] == "skip":
        assert example.marker[1], f"{example.name}: a skip marker says why"
        pytest.skip(f"{example.name}: {example.marker[1]}")
    kind = RUNNABLE[example.lang]
    code = DEFAULT_ADDRESS.sub(f"127.0.0.1:{server.port}", example.code)
    if kind != "python" and re.search(r"(^|[|(\s])jq\b", code) and shutil.which("jq") is None:
        pytest.skip(f"{example.name}: needs jq, which this machine lacks")
    expected_exit = int(example.marker[1]) if example.marker and example.marker[0] == "exit" else 0
    env = _env(server, tmp_path / "home")
    shown_last = None
    if kind == "python":
        script = tmp_path / "example.py"
        script.write_text(code, encoding="utf-8")
        done = _run([sys.executable, str(script)], tmp_path, env, example.name)
    elif kind == "sh":
        done = _run(["bash", "-e", "-o", "pipefail", "-c", code], tmp_path, env, example.name)
    else:  # console: the `$ ` lines are commands, the others what they print
        commands = [line[2:] for line in code.splitlines() if line.startswith("$ ")]
        assert commands, f"{example.name}: a console block with no `$ ` line"
        shown_lines = [line for line in code.splitlines() if line.strip() and not line.startswith("$ ")]
        shown_last = shown_lines[-1] if shown_lines else None
        done = _run(["bash", "-o", "pipefail", "-c", "\n".join(commands)], tmp_path, env, example.name)
    printed = done.stdout + done.stderr
    assert done.returncode == expected_exit, (
        f"{example.name}: exit status {done.returncode}, expected {expected_exit}\n{printed[-4000:]}"
    )
    assert printed.strip(), f"{example.name}: printed nothing"
    if shown_last is not None and "…" not in shown_last and "..." not in shown_last:
        assert shown_last.strip() in printed, f"{example.name}: {shown_last!r} not in what it printed:\n{printed}"
    if example.shown is not None and kind != "python":
        check_shape(example.shown[1], done.stdout, example.name)


def test_every_marker_is_on_a_runnable_block() -> None:
    """A marker on a block the runner never runs (a typo'd language, a json block) is a mistake."""
    for path in doc_files():
        for block in blocks(path):
            if block.marker is not None:
                assert block.lang in RUNNABLE, f"{block.name}: a marker on a ```{block.lang} block, which never runs"
