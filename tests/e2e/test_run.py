"""`lmsp run` as a terminal program (a pty, through pexpect) against a real server: one answer,
piped stdin, a chat that remembers, Ctrl-C during an answer, and a service started when
none answers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pexpect

from helpers import MODEL, SCRIPTED
from lmsp.local_service import answers
from lmsp.testing import free_port

ENV = {**os.environ, "TERM": "dumb"}  # no terminal escapes between the words we look for


def _spawn(*args: str, timeout: float = 30) -> pexpect.spawn:
    return pexpect.spawn(sys.executable, ["-m", "lmsp", "run", *args], env=ENV, encoding="utf-8", timeout=timeout)


def _ended(child: pexpect.spawn) -> int:
    child.expect(pexpect.EOF)
    child.close()
    return int(child.exitstatus)


def test_one_answer_to_a_prompt_in_a_terminal(server):
    child = _spawn(SCRIPTED, "hello", "from", "a", "terminal", "--url", server.url)
    child.expect_exact("hello from a terminal\r\n")
    assert _ended(child) == 0


def test_piped_stdin_is_the_prompt(server):
    done = subprocess.run(
        [sys.executable, "-m", "lmsp", "run", SCRIPTED, "--url", server.url],
        input="words from a pipe\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "words from a pipe\n"


def test_a_chat_remembers_its_turns_until_cleared(server):  # covers: R6.1-6
    child = _spawn(SCRIPTED, "--url", server.url, "--verbose")
    # The scripted model counts two prompt tokens per message ("role: text"): a turn that
    # carries the earlier ones (previous_response_id, from the service's store) shows it.
    for turn, prompt_tokens in (("alpha", 2), ("beta", 6), ("gamma", 10)):
        child.expect_exact(">>> ")
        child.sendline(turn)
        child.expect_exact(f"{turn}\r\n")
        child.expect_exact(f"prompt {prompt_tokens} tokens")
    child.expect_exact(">>> ")
    child.sendline("/clear")
    child.expect_exact("conversation cleared")
    child.expect_exact(">>> ")
    child.sendline("delta")
    child.expect_exact("prompt 2 tokens")
    child.expect_exact(">>> ")
    child.sendline("/set temperature 0.2")
    child.expect_exact("set temperature 0.2")
    child.expect_exact(">>> ")
    child.sendline("/bye")
    assert _ended(child) == 0


def test_ctrl_c_stops_the_answer_and_the_chat_goes_on(server):
    child = _spawn(SCRIPTED, "--url", server.url, "--verbose")
    try:
        child.expect_exact(">>> ")
        # Without end if not stopped. The terminal echoes the line typed: "tick tick" is only in
        # the answer, so the Ctrl-C goes in while the answer streams.
        child.sendline("!slow 100 !repeat tick")
        child.expect_exact("tick tick ")
        child.sendintr()
        child.expect_exact("stopped")
        child.expect_exact(">>> ")
        # The scripted model plays one request at a time: an answer in seconds means the long
        # one was stopped on the server, not merely no longer printed.
        child.sendline("after")
        child.expect_exact("1 tokens in", timeout=5)
        child.expect_exact(">>> ")
        child.sendeof()
        assert _ended(child) == 0
    finally:
        # A client left streaming its endless answer held the session's scripted model, which
        # plays one request at a time: every later scripted test on the shared server waited
        # for it until its timeout (a CI run: 2 more failures after this one).
        child.terminate(force=True)


def test_ctrl_c_stops_the_answer_where_sigint_was_ignored_at_start(server):
    # The full suite's CI runs failed the test above: an earlier test left SIGINT ignored in
    # its worker, every client it started inherited that, and Python then never raises
    # KeyboardInterrupt. `lmsp run` takes Ctrl-C back for itself.
    child = pexpect.spawn(
        sys.executable,
        ["-c", RUN_IGNORING_SIGINT, SCRIPTED, "--url", server.url],
        encoding="utf-8",
        timeout=30,
        env=ENV,
    )
    try:
        child.expect_exact(">>> ")
        child.sendline("!slow 100 !repeat tock")
        child.expect_exact("tock tock ")
        child.sendintr()
        child.expect_exact("stopped")
    finally:
        child.terminate(force=True)


# `lmsp run`, started as a process that ignores SIGINT would start it.
RUN_IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, '-m', 'lmsp', 'run', *sys.argv[1:]])"
)


def test_schema_makes_the_answer_json(server, tmp_path):  # covers: R6.5-6
    schema = tmp_path / "digit.json"
    schema.write_text(
        json.dumps(
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["n"],
                "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
            }
        )
    )
    child = _spawn(MODEL, "--url", server.url, "--temperature", "0", "--max-output-tokens", "16", timeout=60)
    child.expect_exact(">>> ")
    child.sendline(f"/schema {schema}")
    child.expect_exact(f"answers are JSON valid against {schema}")
    child.expect_exact(">>> ")
    child.sendline("Pick a digit.")
    child.expect(r'\r\n(\{"n": \d\})\r\n')
    assert json.loads(child.match.group(1))["n"] in range(10)
    child.expect_exact(">>> ")
    child.sendline("/bye")
    assert _ended(child) == 0


def test_starts_a_service_when_none_answers_and_stops_it_after(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "lmsp",
            "run",
            MODEL,
            "Say hi.",
            "--url",
            url,
            "--temperature",
            "0",
            "--max-output-tokens",
            "4",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env={**os.environ, "LMSP_HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stderr
    assert f"no service answers at {url}; starting `lmsp serve` there" in done.stderr
    assert done.stdout.strip()
    assert not answers(url)  # the service it started ended with it
