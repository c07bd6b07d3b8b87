"""Failure paths of the engine that must end in an answer, never a hang, a leak or a 500: a
scheduler thread that crashes, a model whose template cannot compile. On the real embedded
model: in this process, where threads and queues can be seen, and through a real server for
what a client sees. (A grammar compile past its budget and a logits row of the wrong size:
tests/unit/engine/test_grammar_limits.py.)"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path

import pytest

from helpers import TextSink, assert_problem, body, checked_client
from lmsp.engine.backends import LlamaBackend
from lmsp.engine.chat_template import TemplateRenderError
from lmsp.engine.llama import LlamaModel
from lmsp.engine.registry import ModelEntry, embedded_model_path
from lmsp.engine.sampling import Sampling
from lmsp.engine.scheduler import SchedulerConfig
from lmsp.engine.sequence import GenerationRequest, ModelUnavailable
from lmsp.protocol.errors import ProblemError
from lmsp.service.models import ModelManager
from lmsp.testing import start_server, worker_threads

URL = "/lmsp/v1/responses"
CONFIG = SchedulerConfig(n_parallel=1, ctx_per_sequence=512, n_threads=worker_threads(), max_queue=4)


def _generate(backend: LlamaBackend, text: str, max_tokens: int) -> tuple[TextSink, GenerationRequest]:
    tokens, _ = backend.prepare([{"role": "user", "content": text}])
    sink = TextSink()
    return sink, GenerationRequest(
        prompt=tokens, max_tokens=max_tokens, sink=sink, sampling=Sampling(temperature=0.0, seed=1)
    )


def _crash_next_step(backend: LlamaBackend) -> dict[str, int]:
    """Makes the scheduler thread's next step raise, as a bug in it would; what the queue
    held at that moment is recorded."""
    scheduler = backend.scheduler
    seen: dict[str, int] = {}

    def step() -> None:
        seen["queued"] = scheduler._queue.qsize()
        raise RuntimeError("injected")

    scheduler._step = step  # type: ignore[method-assign]
    return seen


def _scheduler_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("lmsp-scheduler-")]


@pytest.fixture(scope="module")
def model_path() -> Path:
    path = embedded_model_path()
    assert path is not None, "the embedded model is not installed"
    return path


def test_a_crashed_scheduler_fails_what_it_holds_and_what_is_queued_and_refuses_more(model_path):
    backend = LlamaBackend(model_path, CONFIG, name="crashing")
    try:
        held, first = _generate(backend, "Count from one to one hundred.", 400)
        backend.submit(first)
        while not held.text:  # generating: the one slot is taken
            assert not held.ended.wait(0.01), held.reason
        queued, second = _generate(backend, "Say hi.", 8)
        seen = _crash_next_step(backend)
        backend.submit(second)
        assert held.ended.wait(10) and queued.ended.wait(10), "a request was left hanging"
        assert seen == {"queued": 1}  # the second request was still queued when it crashed
        assert held.error == queued.error == "scheduler failure: RuntimeError"
        assert not backend.alive
        with pytest.raises(ModelUnavailable):
            backend.submit(_generate(backend, "Say hi.", 8)[1])
    finally:
        backend.close()
    assert _scheduler_threads() == []


def _crash(backend: LlamaBackend) -> None:
    _crash_next_step(backend)
    sink, request = _generate(backend, "Say hi.", 8)
    backend.submit(request)
    assert sink.ended.wait(10) and sink.error is not None


def test_a_crashed_model_is_loaded_again_or_answers_model_unavailable(model_path, tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copyfile(model_path, path)
    models = ModelManager([ModelEntry("crashing", path)], CONFIG)
    try:
        dead = asyncio.run(models.get("crashing"))
        _crash(dead)
        backend = asyncio.run(models.get("crashing"))
        assert backend is not dead and backend.alive
        sink, request = _generate(backend, "Say hi.", 4)
        backend.submit(request)
        assert sink.ended.wait(30) and sink.reason in ("stop", "max_output_tokens")
        assert _scheduler_threads() == ["lmsp-scheduler-crashing"]  # the dead one was closed

        _crash(backend)
        path.unlink()  # it cannot be loaded again
        with pytest.raises(ProblemError) as raised:
            asyncio.run(models.get("crashing"))
        assert raised.value.code == "model_unavailable"
    finally:
        models.close()
    assert _scheduler_threads() == []


def _with_template(source: Path, target: Path, template: str) -> Path:
    """A copy of the GGUF whose `tokenizer.chat_template` is `template`, padded to the same
    length so that the file's layout is unchanged."""
    model = LlamaModel(source)
    try:
        original = (model.meta("tokenizer.chat_template") or "").encode()
    finally:
        model.close()
    assert original, "the embedded model has a chat template"
    replacement = template.encode().ljust(len(original))
    assert len(replacement) == len(original)
    data = source.read_bytes()
    assert data.count(original) == 1
    target.write_bytes(data.replace(original, replacement))
    return target


def _children() -> set[str]:
    return {pid for f in Path("/proc/self/task").glob("*/children") for pid in f.read_text().split()}


def test_a_template_that_cannot_compile_leaks_nothing_however_often_it_is_loaded(model_path, tmp_path):
    broken = _with_template(model_path, tmp_path / "broken.gguf", "{% for %}")
    children = _children()
    for _ in range(3):
        with pytest.raises(TemplateRenderError, match="chat template failed"):
            LlamaBackend(broken, CONFIG, name="broken")
    assert _scheduler_threads() == []
    assert _children() <= children  # the template's worker processes are gone too


# Loaded by the server's interpreter (and only its: not the template workers'), a bug that
# crashes the scheduler thread when it samples for a prompt that asks for it.
CRASH_HOOK = """
import sys

if sys.orig_argv[1:4] == ["-m", "lmsp", "serve"]:
    from lmsp.engine import scheduler

    advance = scheduler.Scheduler._advance

    def advance_or_crash(self, slot):
        if "CRASH THE SCHEDULER" in slot.active.request.prompt_text:
            raise RuntimeError("injected")
        advance(self, slot)

    scheduler.Scheduler._advance = advance_or_crash
"""


def test_after_a_scheduler_crash_the_server_answers_from_a_model_loaded_again(tmp_path, monkeypatch):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(CRASH_HOOK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])))
    server = start_server(tmp_path, "--parallel", "1")
    try:
        with checked_client(server.url, timeout=30) as client:
            crashed = client.post(URL, json=body("CRASH THE SCHEDULER", max_output_tokens=8))
            assert_problem(crashed, 500, "generation_failed")
            # Before, this one waited for ever for a thread that was gone.
            after = client.post(URL, json=body("Say hi.", max_output_tokens=8, temperature=0))
            assert after.status_code == 200, after.text
            assert after.json()["status"] in ("completed", "incomplete")
    finally:
        server.stop()
    assert "scheduler crashed" in server.log_path.read_text()
