"""`lmsp run MODEL [PROMPT]`: one answer streamed to stdout, or a chat in the terminal, with
a service that answers at the base URL, or one started for the occasion."""

from __future__ import annotations

import argparse
import contextlib
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from .client import APIConnectionError, APIError, Client, Response
from .client.calls import resolve_base_url
from .local_service import LocalService, ServiceError, answers
from .protocol.events import REASONING_DELTA

__all__ = ["add_parser"]

HELP = """\
/set temperature T       sample at T (0 to 2)
/set max_output_tokens N stop after N tokens
/set verbose | quiet     show tokens/s after each answer, or not
/schema FILE             answer with JSON valid against the JSON Schema in FILE (/schema off)
/clear                   forget the conversation
/bye                     leave (so does Ctrl-D); Ctrl-C stops an answer, not the chat"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="chat with a model, or answer one prompt (starts a service if none answers)")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("prompt", nargs="*", metavar="PROMPT", help="answer this and exit (also: text piped to stdin)")
    p.add_argument("--url", default=None, help="the service (default: $LMSP_BASE_URL, else http://127.0.0.1:8750)")
    p.add_argument("--token", default=None, help="bearer token (default: $LMSP_TOKEN)")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--max-output-tokens", type=int, default=None)
    p.add_argument("--schema", default=None, metavar="FILE", help="answer with JSON valid against this JSON Schema")
    p.add_argument("--verbose", action="store_true", help="show token counts and tokens/s after each answer")
    p.add_argument(
        "--model-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="for a service it starts: serve *.gguf under DIR",
    )
    p.set_defaults(func=run)


def _say(text: str) -> None:
    print(f"lmsp: {text}", file=sys.stderr, flush=True)


def _schema_format(path: str) -> dict[str, Any]:
    schema = orjson.loads(Path(path).read_bytes())
    name = re.sub(r"[^A-Za-z0-9_-]", "_", Path(path).stem)[:64] or "schema"
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _prompt(args: argparse.Namespace) -> str | None:
    """The one-shot prompt: the words given, then whatever is piped in; None for a chat."""
    parts = [" ".join(args.prompt)] if args.prompt else []
    if not sys.stdin.isatty():
        parts.append(sys.stdin.read().strip())
    return "\n\n".join(p for p in parts if p) if parts else None


_DIM = "\x1b[2m"
_UNDIM = "\x1b[0m"


def _answer(client: Client, model: str, text: str, fields: dict[str, Any], verbose: bool) -> Response:
    """Streams one answer to stdout as it comes. A KeyboardInterrupt leaves the `with`, which
    hangs up, and the service stops generating (R6.3-6)."""
    # Timed from response.created: loading the model (a service's first request) is not
    # generation speed.
    started: float | None = None
    # A thinking model's thinking, dimmed above the answer on a terminal; piped, the answer alone.
    show_thinking = sys.stdout.isatty()
    thinking = False
    with client.responses.stream(model=model, input=text, **fields) as stream:
        for event in stream:
            started = started or time.monotonic()
            if event.type == REASONING_DELTA and show_thinking:
                if not thinking:
                    sys.stdout.write(_DIM)
                    thinking = True
                sys.stdout.write(str(event.data["delta"]))
                sys.stdout.flush()
            elif event.delta:
                if thinking:
                    sys.stdout.write(_UNDIM + "\n\n")
                    thinking = False
                sys.stdout.write(event.delta)
                sys.stdout.flush()
        if thinking:
            sys.stdout.write(_UNDIM)
        response = stream.final()
    seconds = time.monotonic() - (started or time.monotonic())
    sys.stdout.write("\n")
    sys.stdout.flush()
    if response.status == "failed" and response.error:
        _say(f"the answer failed: {response.error.get('detail')}")
    elif response.status == "incomplete" and response.incomplete_details:
        _say(f"the answer stopped early: {response.incomplete_details.get('reason')}")
    if verbose and response.usage and seconds > 0:
        out = response.usage["output_tokens"]
        _say(
            f"{out} tokens in {seconds:.2f} s ({out / seconds:.1f} tokens/s); "
            f"prompt {response.usage['input_tokens']} tokens"
        )
    return response


class Chat:
    """The conversation lives in the service (store: true), continued by previous_response_id."""

    def __init__(self, client: Client, model: str, fields: dict[str, Any], verbose: bool) -> None:
        self.client = client
        self.model = model
        self.fields = fields
        self.verbose = verbose
        self.previous: str | None = None

    def loop(self) -> int:
        with contextlib.suppress(ImportError):  # line editing and history where the platform has it
            import readline  # noqa: F401  (importing it is what turns it on for input())
        _say(f"chatting with {self.model}; /? for help, /bye or Ctrl-D to leave")
        while True:
            # A Ctrl-C can land anywhere in the loop, not only while input() waits: between
            # reading a line and starting its answer it leaves the line unsent.
            try:
                line = input(">>> ").strip()
                if line.startswith("/"):
                    if not self.command(line):
                        return 0
                elif line:
                    self.turn(line)
            except EOFError:
                print()
                return 0
            except KeyboardInterrupt:
                print()
                _say("Ctrl-C stops an answer; /bye or Ctrl-D leaves")

    def turn(self, text: str) -> None:
        fields = {**self.fields, "store": True, "previous_response_id": self.previous}
        try:
            response = _answer(self.client, self.model, text, fields, self.verbose)
        except KeyboardInterrupt:
            # The interrupted turn is left out of the conversation: the next one continues
            # from the last answer that was heard to its end.
            print()
            _say("stopped")
            return
        except (APIError, APIConnectionError) as exc:
            _say(str(exc))
            return
        if response.status in ("completed", "incomplete"):
            self.previous = response.id

    def command(self, line: str) -> bool:
        """Runs a /command; False to leave."""
        name, _, rest = line.partition(" ")
        rest = rest.strip()
        if name == "/bye":
            return False
        if name in ("/?", "/help"):
            print(HELP)
        elif name == "/clear":
            self.previous = None
            _say("conversation cleared")
        elif name == "/set":
            self._set(rest)
        elif name == "/schema":
            if rest in ("", "off"):
                self.fields.pop("response_format", None)
                _say("answers are free text")
            else:
                try:
                    self.fields["response_format"] = _schema_format(rest)
                except (OSError, orjson.JSONDecodeError) as exc:
                    _say(f"cannot read a JSON Schema from {rest}: {exc}")
                else:
                    _say(f"answers are JSON valid against {rest}")
        else:
            _say(f"unknown command {name}; /? lists them")
        return True

    def _set(self, rest: str) -> None:
        key, _, value = rest.partition(" ")
        try:
            if key == "temperature":
                self.fields["temperature"] = float(value)
            elif key == "max_output_tokens":
                self.fields["max_output_tokens"] = int(value)
            elif key in ("verbose", "quiet"):
                self.verbose = key == "verbose"
            else:
                _say("/set temperature T | max_output_tokens N | verbose | quiet")
                return
        except ValueError:
            _say(f"{key} needs a number, not {value!r}")
            return
        _say(f"set {key}" + (f" {value}" if value else ""))


def run(args: argparse.Namespace) -> int:
    # Ctrl-C stops an answer: Python raises KeyboardInterrupt only if SIGINT was not ignored
    # when it started, and a process started from one that ignores it (a background job, a
    # test runner's worker) inherits that. Its Ctrl-C then did nothing and the answer ran on.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    url = resolve_base_url(args.url)
    fields: dict[str, Any] = {"temperature": args.temperature, "max_output_tokens": args.max_output_tokens}
    try:
        if args.schema:
            fields["response_format"] = _schema_format(args.schema)
    except (OSError, orjson.JSONDecodeError) as exc:
        _say(f"cannot read a JSON Schema from {args.schema}: {exc}")
        return 2
    prompt = _prompt(args)
    with contextlib.ExitStack() as stack:
        if not answers(url):
            _say(f"no service answers at {url}; starting `lmsp serve` there for this session (it stops when run ends)")
            try:
                stack.enter_context(LocalService(url, args.model_dir))
            except ServiceError as exc:
                _say(str(exc))
                return 1
        client = stack.enter_context(Client(url, args.token))
        if prompt is None:
            return Chat(client, args.model, {k: v for k, v in fields.items() if v is not None}, args.verbose).loop()
        try:
            response = _answer(client, args.model, prompt, fields, args.verbose)
        except KeyboardInterrupt:
            print()
            return 130
        except (APIError, APIConnectionError) as exc:
            _say(str(exc))
            return 1
        return 0 if response.status in ("completed", "incomplete") else 1
