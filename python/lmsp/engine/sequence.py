"""What a backend is given (a generation request) and what it reports back (through a sink).

Both backends, llama.cpp's scheduler and the scripted one used for edge cases and benchmarks,
speak this interface, so everything above the engine is backend-agnostic.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Literal, Protocol

from lmsp._core import CompiledGrammar

from .sampling import Sampling

__all__ = [
    "ControlJob",
    "EmbeddingJob",
    "FinishReason",
    "GenerationRequest",
    "ModelUnavailable",
    "Overloaded",
    "Sequence",
    "Sink",
    "SubmissionQueue",
    "fail_job",
]

FinishReason = Literal["stop", "max_output_tokens", "context_length", "cancelled"]


class Sink(Protocol):
    """Receives one sequence's output, on the backend's thread. Must be cheap and never block."""

    def on_text(self, text: str) -> bool | None:
        """True: the output is complete here (a repeated tool call); it ends as if on its own."""
        ...

    def on_finish(self, reason: FinishReason, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> None:
        """`cached_tokens`: prompt tokens reused from an earlier request's KV cells."""
        ...

    def on_error(self, message: str) -> None: ...


class Overloaded(Exception):
    """The backend's queue is full; the client should retry later."""

    def __init__(self, retry_after: int = 1, detail: str = "the model's queue is full; retry later") -> None:
        super().__init__(detail)
        self.retry_after = retry_after
        self.detail = detail


class ModelUnavailable(Exception):
    """The backend has stopped (its thread crashed, or it was closed) and takes no more
    requests; the model must be loaded again."""

    def __init__(self) -> None:
        super().__init__("the model stopped and takes no more requests")


@dataclass
class GenerationRequest:
    prompt: list[int]
    max_tokens: int | None
    sink: Sink
    # How tokens are chosen: temperature, top_k/top_p/min_p, penalties, seed (sampling.py).
    sampling: Sampling = Sampling()
    # Text prompt for backends without a tokenizer (the scripted one); the model ignores it.
    prompt_text: str = ""
    # The grammar the output must follow, or None for free text.
    grammar: CompiledGrammar | None = None
    # The output ends before the first of these, which is never sent.
    stop: tuple[str, ...] = ()
    # Whose cached prompt cells this request may reuse and leave behind (slots, a slot's
    # copy, the memory and disk tiers): only those of the same scope, an opaque key the service
    # derives from the owner (issue 38: a hit tells the client how much of a prompt matched).
    # "" is one scope like any other.
    cache_scope: str = ""


@dataclass
class Sequence:
    """A submitted request as the service sees it: something it can cancel."""

    request: GenerationRequest
    _cancelled: threading.Event = field(default_factory=threading.Event)
    # Takes it out of its backend's queue if it is still there (SubmissionQueue.withdraw).
    _withdraw: Callable[[Sequence], bool] | None = field(default=None, repr=False, compare=False)

    def cancel(self) -> None:
        """Thread-safe; the backend stops within one decode step and frees the slot. One still
        queued ends here and now, and its queue place is free for the next request (else a
        queue of cancelled work would refuse new requests until slots freed)."""
        self._cancelled.set()
        withdraw = self._withdraw
        if withdraw is not None and withdraw(self):
            self.request.sink.on_finish("cancelled", len(self.request.prompt), 0)

    def wait_cancelled(self, timeout: float) -> bool:
        return self._cancelled.wait(timeout)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass
class EmbeddingJob:
    """Inputs to embed, as the model's tokens, in the same queue as generations (so the one
    bound holds for both, and the thread that owns the model runs both); the backend's thread
    answers through `result`."""

    inputs: list[list[int]]
    result: Future[list[list[float]]] = field(default_factory=Future)
    vectors: list[list[float]] = field(default_factory=list)  # done so far, in input order
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        """Thread-safe: nobody waits for the vectors any more (the client left). A queued job
        is skipped when the backend's thread reaches it; a running one stops before its next
        decode (issue 38: 256 window-length inputs kept the model busy after a hang-up)."""
        self._cancelled.set()
        self.result.cancel()  # only while queued: a running future cannot be cancelled

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()


@dataclass
class ControlJob:
    """Work another thread hands the backend's thread, which owns the model's state (e.g. a
    DELETE's forgetting of an owner's cached prompts, issue 38): run between two steps, ahead
    of every queued request, answered through `result`."""

    run: Callable[[], int]
    result: Future[int] = field(default_factory=Future)

    def perform(self) -> None:
        """On the backend's thread."""
        if not self.result.set_running_or_notify_cancel():
            return
        try:
            self.result.set_result(self.run())
        except Exception as exc:  # the waiter says what failed; the thread goes on
            self.result.set_exception(exc)


class SubmissionQueue(queue.Queue["Sequence | EmbeddingJob | ControlJob | None"]):
    """A backend's bounded intake: full means 429, never an unbounded backlog. `None` in the
    queue tells the backend's thread to stop. Once closed, it refuses every submission, so a
    backend whose thread is gone never holds a request that nobody will answer."""

    def __init__(self, maxsize: int, on_withdrawn: Callable[[GenerationRequest], None] | None = None) -> None:
        super().__init__(maxsize)
        self._closing = threading.Lock()
        self._closed = False
        self._on_withdrawn = on_withdrawn

    @property
    def closed(self) -> bool:
        return self._closed

    def submit(self, request: GenerationRequest) -> Sequence:
        seq = Sequence(request, _withdraw=self.withdraw)
        # Under the lock that `close` takes: nothing is queued after `close` drained the queue.
        with self._closing:
            if self._closed:
                raise ModelUnavailable()
            try:
                self.put_nowait(seq)
            except queue.Full:
                raise Overloaded() from None
        return seq

    def withdraw(self, seq: Sequence) -> bool:
        """Takes `seq` out of the queue; False if the backend's thread took it (or `close`
        did) first, which then ends it. Found by identity: a dataclass's == compares prompts."""
        with self.mutex:
            for i, item in enumerate(self.queue):
                if item is seq:
                    del self.queue[i]
                    self.unfinished_tasks -= 1
                    self.not_full.notify()
                    break
            else:
                return False
        if self._on_withdrawn is not None:
            self._on_withdrawn(seq.request)
        return True

    def submit_job(self, job: EmbeddingJob) -> None:
        """Queues an embedding job; raises as `submit` does."""
        with self._closing:
            if self._closed:
                raise ModelUnavailable()
            try:
                self.put_nowait(job)
            except queue.Full:
                raise Overloaded() from None

    def submit_control(self, job: ControlJob) -> None:
        """Queues a control job ahead of everything queued and past the bound (it is no client's
        request, and must not wait behind a full queue); ModelUnavailable once closed."""
        with self._closing:
            if self._closed:
                raise ModelUnavailable()
            with self.mutex:
                self.queue.appendleft(job)
                self.unfinished_tasks += 1
                self.not_empty.notify()

    def take_controls(self) -> list[ControlJob]:
        """The control jobs at the head of the queue (where `submit_control` puts them), taken
        out: the backend's thread runs them even while no slot is free to take a request."""
        jobs: list[ControlJob] = []
        with self.mutex:
            while self.queue and isinstance(self.queue[0], ControlJob):
                jobs.append(self.queue.popleft())
                self.unfinished_tasks -= 1
            if jobs:
                self.not_full.notify()
        return jobs

    def close(self) -> list[Sequence]:
        """Refuses later submissions; returns the sequences still queued, for the caller to end
        (embedding and control jobs still queued are failed here)."""
        with self._closing:
            self._closed = True
        left: list[Sequence] = []
        while True:
            try:
                seq = self.get_nowait()
            except queue.Empty:
                return left
            if isinstance(seq, EmbeddingJob):
                fail_job(seq, ModelUnavailable())
            elif isinstance(seq, ControlJob):
                if seq.result.set_running_or_notify_cancel():
                    seq.result.set_exception(ModelUnavailable())
            elif seq is not None:
                left.append(seq)


def fail_job(job: EmbeddingJob, error: BaseException) -> None:
    """Ends a job with `error` unless it has ended (or its waiter cancelled it)."""
    if not job.result.done():
        try:
            job.result.set_exception(error)
        except Exception:  # cancelled or answered meanwhile: nobody waits for this error
            pass
