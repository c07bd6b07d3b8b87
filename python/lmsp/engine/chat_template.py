"""Renders a model's own chat template (the GGUF's `tokenizer.chat_template`, a Jinja text).

llama.cpp's `llama_chat_apply_template` is not a Jinja renderer (it guesses a format and drops
e.g. SmolLM2's default system prompt), so we render the template itself. A template is
untrusted input that came with a downloaded file: it renders in Jinja's sandbox, in a child
process (`template_worker`) that is killed when it runs past its time budget. Each template
has child processes of its own, so a slow one holds up no other model's renders.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time
import weakref
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
# A child's start (an interpreter, jinja2) is not the template's time: it has this long.
START_LIMIT = 60.0


class TemplateRenderError(ValueError):
    """The template failed on these messages (it may call raise_exception on purpose), or
    ran past its time budget."""


# Children one template may run at once. Each model has its own (a slow template holds up
# no other model's renders), started as concurrent renders need them: up to this many renders
# of one model overlap, and one at its budget holds up only renders past that.
MAX_WORKERS = 4


class _Worker:
    """One child process, rendering one request at a time."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "lmsp.engine.template_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._proc.stdout is not None
        try:
            # On a busy machine the start alone can take longer than a render's budget.
            ready = _read_line(self._proc.stdout.fileno(), time.monotonic() + START_LIMIT)
        except (OSError, TimeoutError):
            self.close()
            raise TemplateRenderError("the chat template's worker process did not start") from None
        if orjson.loads(ready) != {"ready": True}:
            self.close()
            raise TemplateRenderError("the chat template's worker process did not start")

    @property
    def alive(self) -> bool:
        return self._proc.poll() is None

    def ask(self, request: dict[str, Any], budget: float) -> dict[str, Any]:
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(orjson.dumps(request) + b"\n")
            proc.stdin.flush()
            line = _read_line(proc.stdout.fileno(), time.monotonic() + budget)
        except (OSError, TimeoutError) as exc:
            self.close()
            if isinstance(exc, TimeoutError):
                raise TemplateRenderError(f"the chat template ran past its time budget of {budget:g} s") from None
            raise TemplateRenderError("the chat template's worker process died") from None
        answer: dict[str, Any] = orjson.loads(line)
        return answer

    def close(self) -> None:
        proc = self._proc
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


class _Pool:
    """The children rendering one template: an idle one if there is one, else a new one
    while there are fewer than `size`, else the next to come free."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._idle: list[_Worker] = []
        self._count = 0  # idle, busy and being started
        self._changed = threading.Condition()
        self._closed = False

    def ask(self, request: dict[str, Any], budget: float) -> dict[str, Any]:
        with self._changed:
            while not self._idle and self._count >= self._size:
                self._changed.wait()
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                self._count += 1
        try:
            if worker is None:
                worker = _Worker()  # outside the lock: starting a child takes tens of ms
            return worker.ask(request, budget)
        finally:
            self._put_back(worker)

    def _put_back(self, worker: _Worker | None) -> None:
        with self._changed:
            if worker is not None and worker.alive and not self._closed:
                self._idle.append(worker)
            else:
                self._count -= 1
                if worker is not None:
                    worker.close()
            self._changed.notify()

    def close(self) -> None:
        """Ends the idle children now, the busy ones as their renders end."""
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
            self._count -= len(idle)
        for worker in idle:
            worker.close()


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


class ChatTemplate:
    """A model's template, rendered by child processes of its own (see `MAX_WORKERS`);
    thread-safe. `close` ends them (they end too when the template is garbage-collected)."""

    def __init__(
        self, source: str, *, bos_token: str, eos_token: str, budget: float = DEFAULT_BUDGET, workers: int = MAX_WORKERS
    ) -> None:
        self.source = source
        self._bos = bos_token
        self._eos = eos_token
        self.budget = budget
        self._pool = _Pool(workers)
        self._closer = weakref.finalize(self, self._pool.close)
        try:
            self._ask(None)  # a template that cannot compile fails the model's load, not its first request
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._closer()

    def _ask(self, variables: dict[str, Any] | None) -> dict[str, Any]:
        request: dict[str, Any] = {"source": self.source, "bos_token": self._bos, "eos_token": self._eos}
        if variables is not None:
            request["variables"] = variables
        answer = self._pool.ask(request, self.budget)
        if "error" in answer:
            raise TemplateRenderError(answer["error"])
        return answer

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """The prompt for these messages; `tools` (function definitions) is passed to templates
        that render tools themselves, and left undefined when None, as those templates expect;
        `extra`: more variables the template reads (`enable_thinking`, `reasoning_effort`)."""
        variables: dict[str, Any] = {**(extra or {}), "messages": messages}
        if tools is not None:
            variables["tools"] = tools
        text: str = self._ask(variables)["text"]
        return text
