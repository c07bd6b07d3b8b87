"""One model's scheduler: a thread that owns the llama_context and decodes every active
sequence in one batch per step (continuous batching over llama.cpp's batch API).

Per step: each generating sequence contributes its last sampled token, prompts being read
contribute a chunk of what is left of them (so a long prompt never stalls the others for
longer than one chunk), one llama_decode runs, and every sequence whose logits came out
samples its next token.
"""

from __future__ import annotations

import codecs
import logging
import os
import queue
import random
import threading
import time
from collections import deque
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp as ll

from lmsp._core import CompiledGrammar, Constraint, _greedy_at

from .. import wakeups
from ..observability.engine import EngineStats
from ..observability.exchange import Trace, drop_trace, start_trace
from .drafts import NgramDrafter
from .fastforward import forced_room
from .llama import Batch, Context, ContextConfig, EmbeddingContext, LlamaModel
from .model_digest import ContentDigest
from .prompt_cache import MIN_TOKENS, RESTORE_GAIN, PromptCache, common_prefix, worth_restoring
from .prompt_disk import DiskTier, model_identity, scope_owner
from .prompt_shared import SharedEntry, SharedTier
from .sampling import PENALTY_LAST_N, Sampling
from .sequence import ControlJob, EmbeddingJob, FinishReason, GenerationRequest, Sequence, SubmissionQueue, fail_job
from .stops import StopMatcher

__all__ = ["DEFAULT_CACHE_RAM_MIB", "DEFAULT_CACHE_SHARED_BYTES", "Scheduler", "SchedulerConfig", "prompt_chunks"]

log = logging.getLogger(__name__)


# `serve --cache-ram`: what 90 conversations of ~1,000 tokens take with the embedded model
# (23 kB a token), 10-20 with an 8B one; llama-server keeps 8 GiB.
DEFAULT_CACHE_RAM_MIB = 2048
DEFAULT_CACHE_DISK_MIB = 8192
# `serve --cache-shared-bytes`: the shared folder's budget per model, every server's files
# together (its files are the disk tier's: ~23 MB per 1,000 tokens on the embedded model).
DEFAULT_CACHE_SHARED_BYTES = 16 * 1024**3


@dataclass(frozen=True)
class SchedulerConfig:
    # 0: chosen from the model's KV size and the machine's memory (see backends.auto_parallel).
    n_parallel: int = 0
    ctx_per_sequence: int = 4096
    n_batch: int = 512
    # Prompt tokens a step may add while other sequences are generating: bounds how long
    # their next token waits behind someone else's long prompt.
    prefill_chunk: int = 256
    n_threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    # Flash attention: on, off, or None for llama.cpp's choice (LlamaBackend passes its own
    # choice, backends.flash_attn_for; docs/operations/concurrency.md says what each costs).
    flash_attn: bool | None = None
    max_queue: int = 64
    # Host memory for slot states kept beyond the slots (prompt_cache.py); 0: none kept.
    cache_ram_bytes: int = 0
    # Where slot states are kept across restarts (prompt_disk.py), and how many bytes; None: nowhere.
    cache_dir: Path | None = None
    cache_disk_bytes: int = DEFAULT_CACHE_DISK_MIB * 1024 * 1024
    # A folder several servers share prompt states through (prompt_shared.py), its byte budget
    # per model, and where the model's content digest is memoized (the data folder); None: off.
    cache_shared: Path | None = None
    cache_shared_bytes: int = DEFAULT_CACHE_SHARED_BYTES
    digest_memo: Path | None = None
    # Seconds a disk entry is kept unused (the store's retention, --store-retention); 0: no bound.
    cache_max_age: float = 0.0
    # Tokens a grammar forces are decoded in one run with the sampled token before them
    # (fastforward.py); the compiler's vocabulary must be built to force them as well.
    fast_forward: bool = False
    # Prompt-lookup draft tokens a greedy sequence decodes beside its next token (drafts.py,
    # `serve --draft-max`); 0: none.
    draft_max: int = 0
    # Drafts only with flash attention on (`serve --draft auto`): there llama.cpp's logits of a
    # draft position are bit for bit those of decoding it alone, so the text is plain
    # decoding's; without it, the attention of several positions of one sequence is summed in
    # another order (logits up to 1.1 apart on the embedded model), and a near tie may flip.
    draft_needs_flash_attn: bool = False
    # ...and only where the build's flash attention gives a row the same bits in a drafted pass
    # as alone (kernel_check.py: our patched CPU kernel does past 512 cells, upstream's not).
    exact_kernel: bool = True
    # Where the scheduler counts tokens and times (GET /metrics); None: nowhere.
    stats: EngineStats | None = field(default=None, compare=False)


# Prompt tokens another slot must save over a slot's own cache before its cells are copied:
# the copy moves a whole sequence's cache (94 MB at 4,096 tokens for the embedded model, 10-21
# ms on 2 cores: bench/scripts/engine_probe.py), about what decoding 3 to 7 prompt tokens costs there.
COPY_GAIN = 16

# Tokens one embedding input may have, and one embedding decode holds. llama.cpp outputs every
# token of a pooled batch, and a chat model's head turns each into a row of logits: 512 tokens
# of the embedded model's 49,152-token vocabulary are a 100 MB output buffer (2,048 were 400 MB).
EMBEDDING_WINDOW = 512
# Inputs one embedding decode pools (sequences of the embedding context).
EMBEDDING_SEQUENCES = 8
# Embedding jobs taken from the queue ahead of the one being run; the rest wait in the queue,
# under its bound.
EMBEDDING_AHEAD = 2


# A step reads whole prompts, shortest first, until it holds this many prompt tokens: a
# prompt's first token waits for the prompts read before it, not for every prompt that came
# with it. 8 prompts of 48 tokens of the embedded model took 1.0 s read in one step and 1.03 s
# read one a step (2 cores, flash attention on): alike in all, but one a step
# has the k-th first token after k eighths of that, where one step has every first token after
# all of it (a burst of 8 chat turns: the median first token twice as soon). Shorter prompts
# share a step, so a burst of tiny ones is not a step each.
PROMPT_GROUP = 32
# Prompts admitted after one still being read, past which it is read first (twice 8 slots).
PROMPT_PATIENCE = 16


def prompt_chunks(pending: list[int], budget: int) -> list[int]:
    """Prompt tokens each prompt being read adds this step, `pending` shortest first: whole
    prompts, shortest first, until the step holds PROMPT_GROUP prompt tokens, within
    `budget` (a prompt longer than what is left of it gets that much, the rest next step)."""
    chunks = []
    taken = 0
    for n in pending:
        chunk = max(0, min(n, budget - taken)) if taken < PROMPT_GROUP else 0
        chunks.append(chunk)
        taken += chunk
    return chunks


@dataclass
class _Slot:
    seq_id: int
    # Tokens whose KV cells this slot holds; the next prompt reuses the common prefix.
    cached: list[int] = field(default_factory=list)
    # The cache scope of the prompt those cells are (GenerationRequest.cache_scope): only a
    # prompt of the same scope reuses or copies them, and they are saved under it.
    scope: str = ""
    active: Sequence | None = None
    pending: list[int] = field(default_factory=list)
    last_token: int = -1
    # Tokens the grammar forced after `last_token`, decoded with it in the next step.
    forced: list[int] = field(default_factory=list)
    n_out: int = 0
    # Prompt tokens of the active sequence whose KV cells were kept from before, not decoded.
    n_reused: int = 0
    batch_index: int = -1
    sampler: object = None
    # Set when the output follows a grammar: it samples instead of `sampler`.
    constraint: Constraint | None = None
    decoder: codecs.IncrementalDecoder | None = None
    stops: StopMatcher | None = None
    # The active sequence's times and counts, for its request's access line and the metrics.
    trace: Trace | None = None
    # When the slot last took a sequence: among slots that hold nothing of a prompt, the one
    # used longest ago takes it (what it holds is the least likely to come back).
    used: int = 0
    # A copy from or into this slot waits for the next decode (llama.cpp copies a sequence's
    # cells then): its cells must not be saved or overwritten by a restore until it has run.
    copy_pending: bool = False
    # Its owner's states were forgotten (a DELETE, issue 38) while its cells were in use (a
    # sequence running, a copy pending): they are dropped as soon as they are not.
    forget: bool = False
    # A greedy sequence's prompt-lookup drafter (None: no drafts), and the draft tokens this
    # step decodes after `last_token`, at the batch entries after `batch_index`.
    drafter: NgramDrafter | None = None
    drafts: list[int] = field(default_factory=list)


class Scheduler:
    def __init__(self, model: LlamaModel, config: SchedulerConfig, name: str = "model") -> None:
        self.model = model
        self.config = config
        # Every generating sequence puts a token in each step's batch: it holds one per slot.
        n_batch = max(config.n_batch, config.n_parallel, 1)
        self.ctx = Context(
            model,
            ContextConfig(
                n_ctx=config.ctx_per_sequence * config.n_parallel,
                n_seq_max=config.n_parallel,
                n_batch=n_batch,
                n_threads=config.n_threads,
                flash_attn=config.flash_attn,
            ),
        )
        self.batch = Batch(n_batch)
        # A recurrent (or hybrid) model's state cannot be cut back to a position, and rejected
        # draft tokens must be: such models get no drafts.
        recurrent = ll.llama_model_is_recurrent(model.handle) or ll.llama_model_is_hybrid(model.handle)
        inexact = config.draft_needs_flash_attn and (config.flash_attn is not True or not config.exact_kernel)
        self._draft_max = 0 if recurrent or inexact else max(0, config.draft_max)
        self.slots = [_Slot(seq_id=i) for i in range(config.n_parallel)]
        self._queue = SubmissionQueue(maxsize=config.max_queue, on_withdrawn=self._withdrawn)
        self._stopping = False
        self.name = name
        self._stats = config.stats.model(name) if config.stats is not None else None
        if self._stats is not None:
            self._stats.gauges = self._gauges
        self._traces: dict[int, Trace] = {}  # by id() of a queued GenerationRequest
        self._now = 0.0  # when the last step's decode ended
        disk = None
        if config.cache_dir is not None and config.cache_disk_bytes > 0:
            try:
                disk = DiskTier(
                    config.cache_dir,
                    name,
                    model_identity(model.path),
                    config.cache_disk_bytes,
                    max_age=config.cache_max_age,
                )
            except OSError as exc:  # a cache that cannot be kept is no reason to refuse the model
                log.warning("prompt cache: no disk tier in %s (%s)", config.cache_dir, exc)
        self.cache = (
            PromptCache(config.cache_ram_bytes, self._stats, disk) if config.cache_ram_bytes > 0 or disk else None
        )
        self.shared = self._shared_tier(model, config)
        self._admissions = 0
        self._copies_pending = False
        self._busy_since = 0.0  # since when the thread has been working outside llama_decode
        # Embedding jobs taken from the queue, run one decode at a time between steps; and the
        # context they run in, made for the first.
        self._embeddings: deque[EmbeddingJob] = deque()
        self._embedder: EmbeddingContext | None = None
        self._thread = threading.Thread(target=self._run, name=f"lmsp-scheduler-{name}", daemon=True)
        self._thread.start()

    def _shared_tier(self, model: LlamaModel, config: SchedulerConfig) -> SharedTier | None:
        """The shared tier, its model digest started in the background; None when off."""
        if config.cache_shared is None or config.cache_shared_bytes <= 0:
            return None
        digest = ContentDigest(model.path, config.digest_memo)
        try:
            digest.start()
        except OSError as exc:
            log.warning("prompt cache: no shared tier for %s (%s)", self.name, exc)
            return None
        # A state loads only where llama.cpp lays the KV cells out alike: its build and whether
        # V is transposed (flash attention off) are part of the identity with the weights.
        runtime = f"llama-cpp-python {ll.__version__}|flash_attn={config.flash_attn}"
        return SharedTier(
            config.cache_shared, digest, runtime, config.cache_shared_bytes, self._stats, config.cache_max_age
        )

    @property
    def context_window(self) -> int:
        return self.config.ctx_per_sequence

    @property
    def alive(self) -> bool:
        """False once the thread has ended or is ending: every submission is then refused."""
        return not self._queue.closed

    @property
    def full(self) -> bool:
        """Its intake is full: the next submission would be refused (429)."""
        return self._queue.full()

    def submit(self, request: GenerationRequest) -> Sequence:
        """Queues a generation; raises Overloaded when the queue is full, ModelUnavailable
        once the scheduler has stopped."""
        trace = start_trace(self.name, self._stats)
        if trace is None:
            return self._queue.submit(request)
        trace.input_tokens = len(request.prompt)
        self._traces[id(request)] = trace  # before it is queued: the thread may start it at once
        try:
            return self._queue.submit(request)
        except BaseException:
            del self._traces[id(request)]
            drop_trace(trace)
            raise

    def _withdrawn(self, request: GenerationRequest) -> None:
        """A queued request cancelled before it was started (on the cancelling thread)."""
        self._traces.pop(id(request), None)

    @property
    def embedding_window(self) -> int:
        return min(EMBEDDING_WINDOW, self.config.ctx_per_sequence)

    def embed(self, inputs: list[list[int]]) -> EmbeddingJob:
        """Queues inputs (each at most `embedding_window` tokens) to embed, behind the
        generations queued before them; raises as `submit` does. The job's future has the
        vectors in input order, each of unit length; `cancel` drops the inputs not yet decoded."""
        job = EmbeddingJob(inputs)
        self._queue.submit_job(job)
        return job

    def forget_owner(self, owner_key: str) -> Future[int]:
        """Thread-safe: drops every cached prompt state of that owner's scopes (all its cache
        salts) that this model holds: its slots' cells, the memory tier and its disk tier's
        files (a DELETE by that owner, issue 38). Run on the scheduler's thread between two
        steps; the future has how many states went. Cells a running sequence uses go when it
        ends. ModelUnavailable once the scheduler has stopped."""
        job = ControlJob(lambda: self._forget_owner(owner_key))
        self._queue.submit_control(job)
        return job.result

    def _forget_owner(self, owner_key: str) -> int:
        if not owner_key:
            return 0
        gone = 0
        for slot in self.slots:
            if slot.cached and scope_owner(slot.scope) == owner_key:
                slot.forget = True
                gone += self._drop_forgotten(slot)
        if self.cache is not None:
            gone += self.cache.forget_owner(owner_key)
        return gone

    def _drop_forgotten(self, slot: _Slot) -> int:
        """Drops a forgotten slot's cells once nothing uses them; 1 if it did."""
        if not slot.forget or slot.active is not None or slot.copy_pending:
            return 0
        self.ctx.forget(slot.seq_id)
        slot.cached, slot.scope, slot.forget = [], "", False
        return 1

    def _gauges(self) -> tuple[int, int, int]:
        """Queue depth, busy slots and slots, read at scrape time from another thread."""
        return self._queue.qsize(), sum(s.active is not None for s in self.slots), len(self.slots)

    def close(self) -> None:
        if self._stats is not None and self._stats.gauges == self._gauges:
            self._stats.gauges = None
        self._stopping = True
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass
        self._thread.join(timeout=10)
        if self.cache is not None and self.cache.disk is not None and not self._thread.is_alive():
            self._persist(self.cache)
        if self.shared is not None:
            self.shared.close()  # what the last turns left to write
        for slot in self.slots:
            if slot.sampler is not None:
                ll.llama_sampler_free(slot.sampler)
        if self.cache is not None:
            self.cache.clear()
        self.batch.close()
        self.ctx.close()
        if self._embedder is not None:
            self._embedder.close()

    def _persist(self, cache: PromptCache) -> None:
        """At unload or shutdown (the thread has ended: its context is ours now): what the
        slots and memory hold goes to the disk tier, for the conversations to go on after a
        restart."""
        for slot in self.slots:
            if not slot.copy_pending:
                cache.save(self.ctx, slot.seq_id, slot.cached, slot.scope)
        try:
            cache.persist()
        except Exception:  # a full or failing disk must not stop the unload
            log.exception("prompt cache: writing to disk failed")

    # --- the scheduler thread -------------------------------------------------------------

    def _run(self) -> None:
        message = "the model was unloaded"
        self._busy_since = time.perf_counter()
        try:
            while not self._stopping:
                if not self._admit():
                    continue
                if self._embeddings:
                    self._embed_step()
                self._step()
        except Exception as exc:  # a bug here must not leave clients hanging
            log.exception("scheduler crashed")
            message = f"scheduler failure: {type(exc).__name__}"
        wakeups.release()
        self._end_all(message)

    def _end_all(self, message: str) -> None:
        """Once no step will run again: fails what the slots hold and what is queued, and
        refuses what comes next, so that no request waits for a thread that is gone."""
        queued = self._queue.close()
        while self._embeddings:
            fail_job(self._embeddings.popleft(), RuntimeError(message))
        for slot in self.slots:
            if slot.active is not None:
                self._fail(slot, message)
        for seq in queued:
            self._traces.pop(id(seq.request), None)
            if seq.cancelled:
                seq.request.sink.on_finish("cancelled", len(seq.request.prompt), 0)
            else:
                seq.request.sink.on_error(message)

    def _admit(self) -> bool:
        """Moves queued sequences into free slots (blocking while nothing is active); each
        goes to the free slot whose cached tokens share the longest prefix with its prompt."""
        for control in self._queue.take_controls():  # even when no slot is free
            control.perform()
        busy = any(s.active is not None for s in self.slots) or bool(self._embeddings)
        if not busy:
            wakeups.release()  # nothing decodes next: what the last step wrote goes out now
        free = [s for s in self.slots if s.active is None]
        while free and len(self._embeddings) < EMBEDDING_AHEAD:
            try:
                if busy:
                    seq = self._queue.get_nowait()
                else:
                    if self._stats is not None:  # waiting for work is no step's time
                        self._stats.host_seconds += time.perf_counter() - self._busy_since
                    seq = self._queue.get()
                    self._busy_since = time.perf_counter()
            except queue.Empty:
                break
            if seq is None:
                return False
            if isinstance(seq, ControlJob):
                seq.perform()
                continue
            if isinstance(seq, EmbeddingJob):
                # Its waiter may have gone (cancelled) while it was queued: nothing to run.
                if seq.result.set_running_or_notify_cancel():
                    self._embeddings.append(seq)
                    busy = True
                elif self._stats is not None:
                    self._stats.embedding_cancelled += len(seq.inputs)
                continue
            if seq.cancelled:
                self._traces.pop(id(seq.request), None)
                seq.request.sink.on_finish("cancelled", len(seq.request.prompt), 0)
                continue
            # How much of this prompt each slot holds: once, for the choice of slot and of donor.
            # Cells of another cache scope are nothing to it (issue 38: a match would tell its
            # client, in cached_tokens and in time, how much of another owner's prompt it guessed).
            scope = seq.request.cache_scope
            # A slot's cells its owner deleted (waiting for a copy to end) are nothing to anyone.
            shared = [
                common_prefix(s.cached, seq.request.prompt) if s.scope == scope and not s.forget else 0
                for s in self.slots
            ]
            # A slot whose cells are mostly this prompt's start takes it; else the slot used
            # longest ago (an empty one first): a few shared template tokens are no reason to
            # overwrite another conversation (its start can still be copied from there).
            slot = max(
                free,
                key=lambda s: (shared[s.seq_id] if 2 * shared[s.seq_id] >= len(s.cached) else 0, -s.used),
            )
            free.remove(slot)
            self._start(slot, seq, shared)
            busy = True
        return busy

    def _start(self, slot: _Slot, seq: Sequence, shared: list[int]) -> None:
        """`shared[i]`: how many of the prompt's first tokens slot i's cells hold."""
        prompt = seq.request.prompt
        keep = shared[slot.seq_id]
        # Another slot may hold a longer start of this prompt (the same system prompt and
        # tools in another conversation): its cells are copied rather than decoded again.
        donor = max((s for s in self.slots if s is not slot), key=lambda s: shared[s.seq_id], default=None)
        if donor is not None and shared[donor.seq_id] - keep < COPY_GAIN:
            donor = None
        best = shared[donor.seq_id] if donor is not None else keep
        # Beyond the slots, the prompt cache may hold a longer start of it (a conversation
        # whose slot was taken since its last turn).
        cache = self.cache
        entry, restorable = None, 0
        if cache is not None and len(prompt) - best >= RESTORE_GAIN:
            entry, restorable = cache.lookup(prompt, seq.request.cache_scope)
            if entry is not None and (slot.copy_pending or not worth_restoring(restorable - best, len(entry.tokens))):
                entry = None
        # Neither memory nor disk: the shared tier, where another server may have left it.
        found: SharedEntry | None = None
        if entry is None and self.shared is not None and not slot.copy_pending and len(prompt) - best >= RESTORE_GAIN:
            found = self.shared.lookup(prompt, seq.request.cache_scope, best)
            if found is not None and not worth_restoring(found.shared - best, len(found.tokens)):
                found = None
            if found is None and self._stats is not None:
                self._stats.shared_misses += 1
        # What the slot holds and this prompt does not keep is saved before its cells change.
        if cache is not None and not slot.copy_pending and len(slot.cached) - keep >= RESTORE_GAIN:
            cache.save(self.ctx, slot.seq_id, slot.cached, slot.scope)
        stats = self._stats
        if found is not None:
            keep = self._restore_shared(slot, found, keep, best)
        elif entry is not None and cache is not None and cache.restore(self.ctx, entry, slot.seq_id):
            if stats is not None:
                stats.cache_hits += 1
                stats.cache_restored_tokens += restorable - best
            keep = restorable
        elif entry is not None:  # llama.cpp refused the state and emptied the slot
            keep = 0
            if stats is not None:
                stats.cache_misses += 1
        else:
            if cache is not None and stats is not None and len(prompt) - best >= RESTORE_GAIN:
                stats.cache_misses += 1
            if donor is not None:
                self.ctx.copy(donor.seq_id, slot.seq_id)
                donor.copy_pending = slot.copy_pending = self._copies_pending = True
                keep = best
        self._admissions += 1
        slot.used = self._admissions
        if keep == len(prompt):
            keep -= 1  # the last prompt token must be decoded again to get logits
        self.ctx.forget(slot.seq_id, keep)
        slot.cached = prompt[:keep]
        slot.scope = seq.request.cache_scope
        slot.forget = False  # what it keeps is this prompt's (a forgotten slot shared nothing)
        slot.pending = prompt[keep:]
        slot.active = seq
        slot.forced = []
        slot.n_out = 0
        slot.n_reused = keep
        slot.trace = self._traces.pop(id(seq.request), None)
        if self._stats is not None:
            self._stats.prompt_reused += keep
        slot.decoder = codecs.getincrementaldecoder("utf-8")("replace")
        slot.stops = StopMatcher(seq.request.stop) if seq.request.stop else None
        if slot.sampler is not None:
            ll.llama_sampler_free(slot.sampler)
            slot.sampler = None
        request = seq.request
        sampling = request.sampling
        seed = sampling.seed if sampling.seed >= 0 else random.getrandbits(32)
        if request.grammar is not None:
            slot.constraint = self._start_constraint(request.grammar, sampling, seed)
        else:
            slot.constraint = None
            slot.sampler = self._make_sampler(sampling, seed, self.model.n_vocab)
        # Drafts only where verifying them is an argmax: T=0 without penalties, free text or
        # under a grammar (where it is the masked argmax, which commits only the tokens that
        # come out, so a rejected draft leaves nothing in the grammar's state to undo).
        slot.drafter = NgramDrafter(prompt) if sampling.greedy and self._draft_max > 0 else None
        slot.drafts = []

    def _restore_shared(self, slot: _Slot, found: SharedEntry, keep: int, best: int) -> int:
        """Restores a shared state into the slot; returns the prompt tokens the slot keeps."""
        assert self.shared is not None
        started = time.perf_counter()
        state = self.shared.load(found)
        if state is None:  # gone or replaced since the look-up: the slot is as it was
            if self._stats is not None:
                self._stats.shared_misses += 1
            return keep
        ok = self.ctx.load_state(slot.seq_id, state)
        stats = self._stats
        if stats is not None:
            stats.cache_restore_seconds += time.perf_counter() - started
            if ok:
                stats.shared_hits += 1
                stats.cache_restored_tokens += found.shared - best
            else:
                stats.shared_misses += 1
        # llama.cpp refused it (another context size, say) and emptied the sequence.
        return found.shared if ok else 0

    def _share(self, slot: _Slot, seq: Sequence) -> None:
        """At the end of a turn: the slot's state goes to the shared tier, named by the turn's
        prompt (the next turn starts with it). Saving copies the cells here (~15 ms for 700
        tokens on 2 cores); the write is the tier's thread's."""
        shared = self.shared
        if shared is None or slot.copy_pending or len(slot.cached) < MIN_TOKENS or not shared.ready():
            return
        state = self.ctx.save_state(slot.seq_id)
        if state is not None:
            shared.put(slot.cached, state, slot.scope, len(seq.request.prompt))

    @staticmethod
    def _start_constraint(grammar: CompiledGrammar, sampling: Sampling, seed: int) -> Constraint:
        """Output under a grammar: lmsp-constrain samples among the allowed tokens with the same
        stages as llama.cpp's chain (`_make_sampler`), its penalties over the same window."""
        return grammar.start(
            temperature=sampling.temperature,
            seed=seed,
            min_p=sampling.min_p,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            repeat_penalty=sampling.repeat_penalty,
            frequency_penalty=sampling.frequency_penalty,
            presence_penalty=sampling.presence_penalty,
            penalty_last_n=PENALTY_LAST_N,
        )

    @staticmethod
    def _make_sampler(sampling: Sampling, seed: int, n_vocab: int) -> object | None:
        """Free text: llama.cpp's sampler chain, in llama-server's order (penalties, top_k,
        top_p, min_p, temperature, draw), each stage only when it changes something; or None at
        temperature 0 without penalties, where the scheduler reads the argmax in place (the
        fastest path, and what the chain would pick).

        `llama_sampler_sample` accepts the token it returns into the chain, so the penalties'
        window holds this generation's output. llama-server also feeds it the prompt; we do not:
        a prompt's last tokens are mostly the chat template's (role markers, earlier turns'
        end-of-turn token), and penalising those pushes a reply off its own end token. The
        grammar path's window is the output too, so both mean the same."""
        if sampling.greedy:
            return None
        chain: object = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())

        def add(stage: object) -> None:
            ll.llama_sampler_chain_add(chain, stage)

        if sampling.penalized:
            add(
                ll.llama_sampler_init_penalties(
                    n_vocab,
                    PENALTY_LAST_N,
                    sampling.repeat_penalty,
                    sampling.frequency_penalty,
                    sampling.presence_penalty,
                )
            )
        if sampling.temperature <= 0.0:  # penalties, then the likeliest token
            add(ll.llama_sampler_init_greedy())
            return chain
        # A top_k of the whole vocabulary or more keeps every token, as 0 does (and llama.cpp
        # takes an int32, which a larger one would wrap around).
        if 0 < sampling.top_k < n_vocab:
            add(ll.llama_sampler_init_top_k(sampling.top_k))
        if sampling.top_p < 1.0:
            add(ll.llama_sampler_init_top_p(sampling.top_p, 1))
        if sampling.min_p > 0.0:
            add(ll.llama_sampler_init_min_p(sampling.min_p, 1))
        add(ll.llama_sampler_init_temp(sampling.temperature))
        add(ll.llama_sampler_init_dist(seed))
        return chain

    def _finish(self, slot: _Slot, reason: FinishReason) -> None:
        seq = slot.active
        assert seq is not None and slot.decoder is not None
        # Bytes still in the decoder begin a character the output ended inside of (a token
        # limit or a stop cut it): not text, so dropped rather than sent as U+FFFD.
        slot.decoder.reset()
        # Ended without reaching a stop: what the stops held back is text.
        tail = slot.stops.flush() if slot.stops is not None else ""
        if tail and reason != "cancelled":
            seq.request.sink.on_text(tail)
        slot.active = None
        slot.trace = None
        self._drop_forgotten(slot)
        if reason in ("stop", "max_output_tokens"):
            self._share(slot, seq)
        seq.request.sink.on_finish(reason, len(seq.request.prompt), slot.n_out, slot.n_reused)

    def _embed_step(self) -> None:
        """One decode of the first embedding job: as many of its next inputs as one batch
        holds, so a long job lets the generating sequences step between its decodes."""
        job = self._embeddings[0]
        if job.cancelled:  # its client left: what is not decoded yet never will be
            self._embeddings.popleft()
            if self._stats is not None:
                self._stats.embedding_cancelled += len(job.inputs) - len(job.vectors)
            fail_job(job, CancelledError())
            return
        try:
            if self._embedder is None:
                self._embedder = EmbeddingContext(
                    self.model,
                    n_ctx=self.embedding_window,
                    n_seq_max=EMBEDDING_SEQUENCES,
                    n_threads=self.config.n_threads,
                )
            start = end = len(job.vectors)
            total = 0
            while end < len(job.inputs) and end - start < EMBEDDING_SEQUENCES:
                n = len(job.inputs[end])
                if total + n > self._embedder.n_ctx and end > start:
                    break
                total += n
                end += 1
            wakeups.release()  # as before a step's decode: what was written goes out now
            job.vectors.extend(self._embedder.embed(job.inputs[start:end]))
            if self._stats is not None:
                self._stats.prompt_decoded += total
                self._stats.embedding_inputs += end - start
        except Exception as exc:  # the job fails; the model goes on serving
            log.exception("embedding failed")
            self._embeddings.popleft()
            fail_job(job, exc)
            return
        if len(job.vectors) == len(job.inputs):
            self._embeddings.popleft()
            job.result.set_result(job.vectors)

    def _step(self) -> None:
        batch = self.batch
        batch.clear()
        limit = self.config.ctx_per_sequence
        live: list[_Slot] = []
        for slot in self.slots:
            seq = slot.active
            if seq is None:
                continue
            if seq.cancelled:
                self._finish(slot, "cancelled")
            elif not slot.pending and len(slot.cached) >= limit:
                self._finish(slot, "context_length")
            else:
                live.append(slot)
        # Prompts fill the room left after every generating sequence's token, shortest first
        # so a short prompt is not held behind a long one; while others are generating, a
        # prompt gets at most `prefill_chunk` tokens a step so their tokens keep flowing.
        n_generating = sum(not s.pending for s in live)
        budget = batch.capacity - n_generating - sum(len(s.forced) for s in live)
        if n_generating:
            budget = min(budget, self.config.prefill_chunk)
        # Shortest first; but a prompt that PROMPT_PATIENCE later ones overtook goes first, so
        # short prompts arriving one after another cannot hold a long one back for ever.
        admissions = self._admissions
        prompting = sorted(
            (s for s in live if s.pending),
            key=lambda s: (admissions - s.used < PROMPT_PATIENCE, len(s.pending)),
        )
        sizes = prompt_chunks([len(s.pending) for s in prompting], budget)
        chunks = {s.seq_id: n for s, n in zip(prompting, sizes, strict=True) if n}
        # The batch lists its tokens in sequence order: llama.cpp cuts a batch for per-sequence
        # caches into blocks of consecutive sequence ids (llama_batch_allocr::split_equal), so
        # out of order it decodes in many small pieces (8 generating tokens shuffled took 53 ms
        # here, against 33 in order).
        sampled: list[_Slot] = []
        room = budget - sum(chunks.values())  # what drafts may fill, after every prompt's chunk
        for slot in live:
            slot.batch_index = -1
            if not slot.pending:
                if slot.forced:
                    slot.batch_index = self._add_forced(batch, slot)
                else:
                    slot.batch_index = batch.add(slot.last_token, len(slot.cached), slot.seq_id, True)
                    slot.cached.append(slot.last_token)
                    # Drafts only for a sequence generating alone: llama.cpp decodes a batch
                    # for per-sequence caches in passes of equal tokens per sequence, so beside
                    # others a draft is a pass of its own, each draft position costs on a CPU
                    # what a batched sequence's token does, and the step lasts until the slowest
                    # sequence's tokens are in (docs/operations/concurrency.md#drafts).
                    if slot.drafter is not None and n_generating == 1:
                        room -= self._add_drafts(slot, room)
                sampled.append(slot)
                continue
            n = chunks.get(slot.seq_id, 0)
            if n == 0:
                continue
            chunk, slot.pending = slot.pending[:n], slot.pending[n:]
            pos = len(slot.cached)
            for i, tok in enumerate(chunk):
                idx = batch.add(tok, pos + i, slot.seq_id, i == n - 1 and not slot.pending)
            slot.cached.extend(chunk)
            if self._stats is not None:
                self._stats.prompt_decoded += n
            if not slot.pending:
                slot.batch_index = idx
                sampled.append(slot)
        if batch.n == 0:
            return
        # What the last step wrote reaches its readers now: the loop's work for them overlaps
        # this decode instead of delaying it (wakeups.py).
        wakeups.release()
        started = time.perf_counter()
        rc = self.ctx.decode(batch)
        self._now = time.perf_counter()  # its tokens all came out now
        if self._stats is not None:
            self._stats.host_seconds += started - self._busy_since
            self._stats.steps += 1
            self._stats.tokens_decoded += batch.n
            self._stats.decode_seconds += self._now - started
        self._busy_since = self._now
        if rc != 0:
            self._fail_all(rc)
            return
        if self._copies_pending:  # this decode made them
            self._copies_pending = False
            for slot in self.slots:
                slot.copy_pending = False
                self._drop_forgotten(slot)
        wakeups.hold()
        for slot in sampled:
            self._advance(slot)

    def _pick(self, slot: _Slot, index: int) -> tuple[int, bool] | None:
        """The token the sequence takes from batch entry `index`'s logits, and whether its
        grammar ends with it; None when its output ended there (finished or failed)."""
        model = self.model
        if slot.constraint is not None:
            constraint = slot.constraint
            token, complete = constraint._step_at(self.ctx.logits_address(index), model.n_vocab)
            if token < 0:
                error = constraint.error
                if error:
                    self._fail(slot, f"the output could not follow its grammar: {error}")
                else:
                    self._finish(slot, "stop")
                return None
            return token, complete
        if slot.sampler is None:  # temperature 0, no penalties: the likeliest token, read in place
            token = _greedy_at(self.ctx.logits_address(index), model.n_vocab)
        else:
            token = ll.llama_sampler_sample(slot.sampler, self.ctx.handle, index)
        if model.is_eog(token):
            self._finish(slot, "stop")
            return None
        return token, False

    def _emit(self, slot: _Slot, token: int, complete: bool = False) -> bool:
        """One output token, sampled or forced, through the text path: counted, decoded, held
        against the stops, handed to the sink, held to max_tokens; `complete`: the grammar ends
        with it. True when the output ended here."""
        seq = slot.active
        assert seq is not None and slot.decoder is not None
        slot.n_out += 1
        if slot.trace is not None:
            slot.trace.token(self._now)
        if slot.drafter is not None:
            slot.drafter.extend((token,))
        text = slot.decoder.decode(self.model.piece(token))
        if slot.stops is not None:
            text, stopped = slot.stops.feed(text)
            if text and seq.request.sink.on_text(text):
                stopped = True
            if stopped:
                slot.stops = None  # what it held is cut off with the stop sequence
                self._finish(slot, "stop")
                return True
        elif text and seq.request.sink.on_text(text):
            self._finish(slot, "stop")  # the sink has what it needs (a repeated tool call)
            return True
        max_tokens = seq.request.max_tokens
        if complete:
            self._finish(slot, "stop")
        elif max_tokens is not None and slot.n_out >= max_tokens:
            self._finish(slot, "max_output_tokens")
        else:
            return False
        return True

    def _fast_forward(self, slot: _Slot) -> bool:
        """With fast-forward on, the tokens the grammar forces after the one just chosen: sent
        now, each through `_emit`, and decoded after it in the next step (`_add_forced`),
        unless the output ended among them (fastforward.py). True when any were forced."""
        seq, constraint = slot.active, slot.constraint
        if constraint is None or not self.config.fast_forward:
            return False
        assert seq is not None
        room = forced_room(
            n_out=slot.n_out,
            max_tokens=seq.request.max_tokens,
            cached=len(slot.cached),
            window=self.config.ctx_per_sequence,
            share=self.batch.capacity // len(self.slots),
        )
        forced, complete = constraint._fast_forward(room)
        last = len(forced) - 1
        for i, token in enumerate(forced):
            if self._stats is not None:
                self._stats.forced_tokens += 1
            if self._emit(slot, token, complete and i == last):
                return True
        slot.forced = forced
        return bool(forced)

    def _add_forced(self, batch: Batch, slot: _Slot) -> int:
        """Adds the sampled token and the run forced after it at consecutive positions, logits
        for the last only (what comes next is sampled from there); returns its batch index."""
        run = [slot.last_token, *slot.forced]
        slot.forced = []
        pos = len(slot.cached)
        last = len(run) - 1
        for i, token in enumerate(run):
            index = batch.add(token, pos + i, slot.seq_id, i == last)
        slot.cached.extend(run)
        return index

    def _add_drafts(self, slot: _Slot, room: int) -> int:
        """Puts a greedy sequence's draft after its last token (already in the batch, at the
        end of `slot.cached`), within `room` batch entries; returns how many it took. The
        draft never reaches past the context window, nor past what max_tokens lets come out
        (a step emits at most one token more than its draft)."""
        assert slot.drafter is not None and slot.active is not None
        k = min(self._draft_max, room, self.config.ctx_per_sequence - len(slot.cached))
        max_tokens = slot.active.request.max_tokens
        if max_tokens is not None:
            k = min(k, max_tokens - slot.n_out - 1)
        drafts = slot.drafter.draft(k)
        pos = len(slot.cached)
        for i, token in enumerate(drafts):
            self.batch.add(token, pos + i, slot.seq_id, True)
        slot.cached.extend(drafts)
        slot.drafts = drafts
        if self._stats is not None:
            self._stats.draft_proposed += len(drafts)
        return len(drafts)

    def _advance(self, slot: _Slot) -> None:
        """A step's outcome for a sequence whose logits came out: its next token, then the
        fast-forwarded run after it. With a draft, the model's choice after the last token and
        after each draft token in turn (the argmax, or under a grammar the masked argmax),
        emitted until one differs from the draft (that one is the model's own next token) or
        the output ends. The accepted draft tokens' KV cells were computed from exactly the
        tokens the model would have chosen, so they stay; the cells of the rest are removed,
        and `slot.cached` lists the cache again."""
        drafts, slot.drafts = slot.drafts, []
        accepted = 0
        goes_on = False  # the loop stopped at the model's own next token, the output going on
        for i in range(len(drafts) + 1):
            picked = self._pick(slot, slot.batch_index + i)
            if picked is None:
                break
            token, complete = picked
            slot.last_token = token
            if self._emit(slot, token, complete):
                break
            if i == len(drafts) or token != drafts[i]:
                goes_on = True
                break
            # Plain decoding fast-forwards after every token: where the grammar forces a run
            # here, the run follows this token instead of the rest of the draft, and this
            # token's cell is dropped with the rest to be decoded again before the run.
            if self._fast_forward(slot):
                break
            accepted += 1
        rejected = len(drafts) - accepted
        if rejected:
            del slot.cached[len(slot.cached) - rejected :]
            self.ctx.forget(slot.seq_id, len(slot.cached))
        if self._stats is not None:
            self._stats.draft_accepted += accepted
        if goes_on:
            self._fast_forward(slot)

    def _fail(self, slot: _Slot, message: str) -> None:
        seq = slot.active
        assert seq is not None
        slot.active = None
        slot.trace = None
        self._drop_forgotten(slot)
        seq.request.sink.on_error(message)

    def _fail_all(self, rc: int) -> None:
        log.error("llama_decode returned %d", rc)
        for slot in self.slots:
            if slot.active is not None:
                slot.cached = []
                self.ctx.forget(slot.seq_id)
                self._fail(slot, f"llama_decode failed ({rc})")
