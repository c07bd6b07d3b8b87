"""Renders a model's own chat template (the GGUF's `tokenizer.chat_template`, a Jinja text).

llama.cpp's `llama_chat_apply_template` is not a Jinja renderer (it guesses a format and drops
e.g. SmolLM2's default system prompt), so we render the template itself. A template is
untrusted input that came with a downloaded file: it renders in Jinja's sandbox, in a child
process (`template_worker`) that is killed when it runs past its time budget.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

import orjson

__all__ = ["CHATML", "DEFAULT_BUDGET", "ChatTemplate", "TemplateRenderError"]

# Used when a GGUF carries no template at all.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)

# Real templates render in well under a millisecond, a 4 MiB input in tens of them.
DEFAULT_BUDGET = 1.0


class TemplateRenderError(ValueError):
    """The template failed on these messages (it may call raise_exception on purpose), or
    ran past its time budget."""


class _Worker:
    """The one child process that renders every model's template, one render at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None

    def ask(self, request: dict[str, Any], budget: float) -> dict[str, Any]:
        with self._lock:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                proc = self._proc = subprocess.Popen(
                    [sys.executable, "-m", "lmsp.engine.template_worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
            assert proc.stdin is not None and proc.stdout is not None
            try:
                proc.stdin.write(orjson.dumps(request) + b"\n")
                proc.stdin.flush()
                line = _read_line(proc.stdout.fileno(), time.monotonic() + budget)
            except (OSError, TimeoutError) as exc:
                _end(proc)
                self._proc = None
                if isinstance(exc, TimeoutError):
                    raise TemplateRenderError(f"the chat template ran past its time budget of {budget:g} s") from None
                raise TemplateRenderError("the chat template's worker process died") from None
        answer: dict[str, Any] = orjson.loads(line)
        return answer


def _end(proc: subprocess.Popen[bytes]) -> None:
    proc.kill()
    proc.wait()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


def _read_line(fd: int, deadline: float) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            raise TimeoutError
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            raise OSError("the worker closed its output")
        data += chunk
    return data


_worker = _Worker()


class ChatTemplate:
    def __init__(self, source: str, *, bos_token: str, eos_token: str, budget: float = DEFAULT_BUDGET) -> None:
        self.source = source
        self._bos = bos_token
        self._eos = eos_token
        self.budget = budget
        self._ask(None)  # a template that cannot compile fails the model's load, not its first request

    def _ask(self, variables: dict[str, Any] | None) -> dict[str, Any]:
        request: dict[str, Any] = {"source": self.source, "bos_token": self._bos, "eos_token": self._eos}
        if variables is not None:
            request["variables"] = variables
        answer = _worker.ask(request, self.budget)
        if "error" in answer:
            raise TemplateRenderError(answer["error"])
        return answer

    def render(self, messages: list[dict[str, str]]) -> str:
        text: str = self._ask({"messages": messages})["text"]
        return text
