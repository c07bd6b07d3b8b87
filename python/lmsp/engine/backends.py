"""Backends a model id can resolve to: llama.cpp (the real thing) and a scripted one for
protocol edge cases and benchmarks of everything above the model."""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from .chat_template import CHATML, ChatTemplate
from .grammar import GrammarCompiler
from .llama import LlamaModel, build_info, kernel_check
from .scheduler import Scheduler, SchedulerConfig
from .sequence import EmbeddingJob, GenerationRequest, Sequence, SubmissionQueue
from .thinking import ThinkFormat, think_format_of
from .tools import HERMES, CallFormat, call_format_of

__all__ = [
    "Backend",
    "ContextLengthExceeded",
    "Embedder",
    "LlamaBackend",
    "ScriptedBackend",
    "auto_parallel",
    "device_of_build",
    "memory_bytes",
]


class ContextLengthExceeded(ValueError):
    def __init__(self, tokens: int, window: int) -> None:
        super().__init__(f"the input is {tokens} tokens after the chat template; the model's window is {window}")
        self.tokens = tokens
        self.window = window


class Embedder(Protocol):
    """A model's embedding path: text to its tokens, tokens to one pooled vector per input."""

    window: int  # tokens one input may have
    dimensions: int
    vocab_size: int  # token ids given as input are below this

    def tokenize(self, text: str) -> list[int]: ...

    def embed(self, inputs: list[list[int]]) -> EmbeddingJob:
        """Queued with the model's generations; raises Overloaded or ModelUnavailable as
        `submit` does. The job's future: vectors of unit length, in input order; its `cancel`
        drops the inputs not yet decoded."""
        ...


class Backend(Protocol):
    context_window: int
    device: str
    capabilities: tuple[str, ...]
    # How the backend shapes output (None: it cannot, and lacks `structured_output`).
    grammars: GrammarCompiler | None

    # How the model writes function calls (its template's frame, or Hermes).
    calls: CallFormat
    # None: the backend computes no embeddings.
    embedder: Embedder | None

    # How the model thinks before it answers (None: it does not), from its template.
    thinking: ThinkFormat | None

    def prepare(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        variables: dict[str, Any] | None = None,
        suffix: str = "",
    ) -> tuple[list[int], str]:
        """Prompt tokens and text for these chat messages (and, for a template that renders
        them, tools); `variables`: more the template reads; `suffix`: text after the rendered
        prompt. Raises ContextLengthExceeded."""
        ...

    @property
    def alive(self) -> bool:
        """False once the backend takes no more requests (e.g. its thread crashed)."""
        ...

    @property
    def full(self) -> bool:
        """Its queue is full: a submission now would raise Overloaded."""
        ...

    def submit(self, request: GenerationRequest) -> Sequence:
        """Raises Overloaded when its queue is full, ModelUnavailable once it is not alive."""
        ...

    def forget_owner(self, owner_key: str) -> Future[int]:
        """Thread-safe: drops every cached prompt state of that owner key's scopes (a DELETE by
        that owner, issue 38); the future has how many went. Raises ModelUnavailable once the
        backend has stopped."""
        ...

    def close(self) -> None: ...


def device_of_build() -> str:
    info = build_info()
    if not info["gpu_offload"]:
        return "cpu"
    system = str(info["system_info"]).upper()
    return "metal" if "METAL" in system else "cuda"


def build_report() -> dict[str, object]:
    """The build, its CPU variant and its kernel check on the device `serve` would use: `lmsp
    doctor` prints it, the start-up lines say it in short (`describe_build`)."""
    info = build_info()
    device = device_of_build()
    check = kernel_check(device)
    return {
        **info,
        "device": device,
        "kernel_check": None
        if check is None
        else {"device": check.device, "drafted": check.drafted, "batched": check.batched},
        # what `--draft auto` rests on (docs/operations/builds.md#what-each-build-keeps)
        "drafts_exact": check is not None and check.drafted,
    }


def describe_build(report: dict[str, object]) -> str:
    """The start-up line: which llama.cpp runs, on which CPU variant, and what it guarantees."""
    variant = report["cpu_variant"]
    cpu = f"CPU variant {variant} ({report['cpu_variant_reason']})" if variant != "built in" else "CPU built in"
    build = "lmsp's patched build" if report["patched"] else "a build without lmsp's patch"
    if report["drafts_exact"]:
        keeps = "drafts exact: a row's attention has the same bits in a drafted pass as alone (kernel check)"
    else:
        keeps = "--draft auto drafts nothing: a row's attention has other bits in a drafted pass (kernel check)"
    return f"llama.cpp {report['llama_cpp_python']}, {build}, {report['device']}, {cpu}; {keeps}"


def flash_attn_for(choice: bool | None, exact: bool) -> bool | None:
    """Flash attention for a context: the user's choice; else, where the build's kernel gives a
    row the same bits in any pass (`exact`, kernel_check.py), on, said outright so that `--draft
    auto` drafts: on a CPU that is our patched kernel, which makes a decode step faster than
    without flash attention at every context measured (bench/scripts/flash_attn_probe.py).
    Elsewhere llama.cpp's own choice (None): on a CPU build without our patch that is on, the
    faster of the two there up to a few hundred tokens (docs/operations/builds.md)."""
    if choice is not None:
        return choice
    return True if exact else None


MAX_AUTO_PARALLEL = 8
# Share of the machine's memory the KV caches of the auto-chosen slots may take.
KV_MEMORY_SHARE = 0.25


def auto_parallel(kv_bytes_per_sequence: int, memory_bytes: int) -> int:
    """Slots when the user did not say: as many as fit the memory share, at most 8 (more
    sequences per step stop paying off on a CPU, and each slot costs its full window)."""
    fit = int(memory_bytes * KV_MEMORY_SHARE) // max(1, kv_bytes_per_sequence)
    return max(1, min(MAX_AUTO_PARALLEL, fit))


def memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class LlamaBackend:
    capabilities: tuple[str, ...] = ("streaming", "structured_output", "tools")

    def __init__(
        self,
        path: Path,
        config: SchedulerConfig,
        *,
        name: str,
        gpu_layers: int | None = None,
        chat_template: str | None = None,
        progress: Callable[[float], None] | None = None,
    ) -> None:
        """`chat_template`: a Jinja template to render prompts with instead of the file's own;
        `progress`: called with the fraction of the file loaded."""
        self.device = device_of_build()
        layers = gpu_layers if gpu_layers is not None else (-1 if self.device != "cpu" else 0)
        check = kernel_check("cpu" if layers == 0 else self.device)
        exact = check is not None and check.drafted
        config = replace(config, flash_attn=flash_attn_for(config.flash_attn, exact), exact_kernel=exact)
        # What can fail (the file, its template, its vocabulary) is built before the context
        # and the scheduler's thread; whatever fails, what was built is closed again.
        with ExitStack() as built:
            self.model = LlamaModel(path, gpu_layers=layers, progress=progress)
            built.callback(self.model.close)
            self.template = ChatTemplate(
                chat_template or self.model.meta("tokenizer.chat_template") or CHATML,
                bos_token=self.model.bos_text,
                eos_token=self.model.eos_text,
            )
            built.callback(self.template.close)
            self.grammars: GrammarCompiler | None = GrammarCompiler.for_model(
                self.model, fast_forward=config.fast_forward
            )
            built.callback(self.grammars.close)
            window = min(config.ctx_per_sequence, self.model.n_ctx_train or config.ctx_per_sequence)
            parallel = config.n_parallel or auto_parallel(self.model.kv_bytes_per_token * window, memory_bytes())
            self.scheduler = Scheduler(
                self.model, replace(config, ctx_per_sequence=window, n_parallel=parallel), name=name
            )
            built.pop_all()
        self.context_window = window
        self.calls = call_format_of(self.template.source)
        self.thinking = think_format_of(self.template.source)
        if self.thinking is not None:
            self.capabilities = (*type(self).capabilities, "reasoning")
        self.embedder: Embedder | None = LlamaEmbedder(self.model, self.scheduler)

    @property
    def alive(self) -> bool:
        return self.scheduler.alive

    @property
    def full(self) -> bool:
        return self.scheduler.full

    def prepare(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        variables: dict[str, Any] | None = None,
        suffix: str = "",
    ) -> tuple[list[int], str]:
        text = self.template.render(messages, tools=tools, extra=variables) + suffix
        # The template usually writes BOS itself; adding it again would change the prompt.
        bos = self.model.bos_text
        add_bos = self.model.adds_bos and not (bos and text.startswith(bos))
        tokens = self.model.tokenize(text, add_special=add_bos)
        if len(tokens) >= self.context_window:
            raise ContextLengthExceeded(len(tokens), self.context_window)
        return tokens, text

    def submit(self, request: GenerationRequest) -> Sequence:
        return self.scheduler.submit(request)

    def forget_owner(self, owner_key: str) -> Future[int]:
        return self.scheduler.forget_owner(owner_key)

    def close(self) -> None:
        if self.grammars is not None:
            self.grammars.close()
        self.scheduler.close()
        self.template.close()
        self.model.close()
        _give_back_freed_heap()


class LlamaEmbedder:
    """Embeddings of the loaded model, computed on its scheduler's thread between its steps."""

    def __init__(self, model: LlamaModel, scheduler: Scheduler) -> None:
        self._model = model
        self._scheduler = scheduler
        self.window = scheduler.embedding_window
        self.dimensions = model.n_embd
        self.vocab_size = model.n_vocab

    def tokenize(self, text: str) -> list[int]:
        return self._model.tokenize(text, add_special=self._model.adds_bos)

    def embed(self, inputs: list[list[int]]) -> EmbeddingJob:
        return self._scheduler.embed(inputs)


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def _give_back_freed_heap() -> None:
    """glibc keeps the heap pages a closed model freed (llama.cpp's buffers, the vocabulary's
    tables) for later; without this each unload and reload would leave the process ~20 MiB
    larger (measured over six cycles of the embedded model). Elsewhere a no-op."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


class ScriptedBackend:
    """Plays a script written in the last user message, one word per "token":

    - `!repeat WORD`: WORD forever, until max_output_tokens;
    - `!fail N`: N words, then a backend failure;
    - `!slow MS rest…`: the rest, MS milliseconds apart (for cancel and slow-reader tests);
      `!slow MS !repeat WORD` repeats WORD so paced;
    - anything else is echoed back word by word, then the response completes.
    """

    capabilities: tuple[str, ...] = ("streaming",)
    device = "cpu"
    grammars: GrammarCompiler | None = None
    calls = HERMES
    thinking: ThinkFormat | None = None
    embedder: Embedder | None = None

    def __init__(self, context_window: int = 4096, max_queue: int = 64) -> None:
        self.context_window = context_window
        self._queue = SubmissionQueue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="lmsp-scripted", daemon=True)
        self._thread.start()

    def prepare(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        *,
        variables: dict[str, Any] | None = None,
        suffix: str = "",
    ) -> tuple[list[int], str]:
        text = "\n".join(f"{m['role']}: {m['content']}" for m in messages)
        tokens = list(range(len(text.split())))
        if len(tokens) >= self.context_window:
            raise ContextLengthExceeded(len(tokens), self.context_window)
        last_user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        return tokens, last_user

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def full(self) -> bool:
        return self._queue.full()

    def submit(self, request: GenerationRequest) -> Sequence:
        return self._queue.submit(request)

    def forget_owner(self, owner_key: str) -> Future[int]:
        """It caches no prompt: nothing to forget."""
        done: Future[int] = Future()
        done.set_result(0)
        return done

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while (seq := self._queue.get()) is not None:
            if isinstance(seq, Sequence):  # it queues no embedding jobs (it has no embedder)
                self._play(seq)

    @staticmethod
    def _number(words: list[str]) -> int | None:
        """The directive's argument; None when missing or not a non-negative integer, in
        which case the message is simply echoed (any text must be safe to send here)."""
        return int(words[1]) if len(words) > 1 and words[1].isdigit() and words[1].isascii() else None

    @staticmethod
    def _play(seq: Sequence) -> None:
        req = seq.request
        sink = req.sink
        n_in = len(req.prompt)
        words = req.prompt_text.split(" ")
        limit = req.max_tokens
        delay = 0.0
        fail_after = -1
        repeat = False
        if words[0] == "!repeat":
            repeat, words = True, [(words[1] if len(words) > 1 else "x") + " "]
        elif words[0] == "!fail" and (n := ScriptedBackend._number(words)) is not None:
            fail_after, words = n, ["w "]
            repeat = True
        elif words[0] == "!slow" and (n := ScriptedBackend._number(words)) is not None:
            delay, words = n / 1000, words[2:] or [""]
            if words[0] == "!repeat":  # paced repeats: a long stream from a short prompt
                repeat, words = True, [(words[1] if len(words) > 1 else "x") + " "]
        if not repeat:
            words = [w + " " for w in words[:-1]] + words[-1:]
        n = 0
        while True:
            if seq.cancelled:
                sink.on_finish("cancelled", n_in, n)
                return
            if n == fail_after:
                sink.on_error("scripted failure")
                return
            if not repeat and n == len(words):
                sink.on_finish("stop", n_in, n)
                return
            if limit is not None and n >= limit:
                sink.on_finish("max_output_tokens", n_in, n)
                return
            sink.on_text(words[0] if repeat else words[n])
            n += 1
            if delay:
                seq.wait_cancelled(delay)
