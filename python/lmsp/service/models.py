"""The models this service serves: loaded on their first request, unloaded when idle, and
their §5 descriptions.

A request holds its model (a `Lease`) from before the load until its generation ends, and a
held model is never unloaded. Held by nobody, a model stays loaded `keep_alive` seconds (0:
unloaded at once; -1: for ever). `max_loaded` bounds the models loaded at once, and
`max_loaded_bytes` their memory (each model's estimated from its files, engine.footprint): to
load one more, the least recently used idle models are unloaded first, and while every loaded
model is busy the request waits for one to become idle. State changes on the event loop only: the end
of a generation, reported on its backend's thread, hops to the loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from ..engine.backends import Backend, LlamaBackend, device_of_build
from ..engine.discovery import Moved, confirm, shards
from ..engine.footprint import estimate_bytes
from ..engine.llama import LoadAborted, ModelLoadError
from ..engine.prompt_disk import forget_owner_files
from ..engine.registry import ModelEntry
from ..engine.scheduler import SchedulerConfig
from ..engine.sequence import GenerationRequest, ModelUnavailable, Sequence, Sink
from ..observability.exchange import note_model
from ..observability.metrics import Metrics
from ..protocol.errors import ProblemError

__all__ = ["DEFAULT_KEEP_ALIVE", "DEFAULT_MAX_LOADED", "Lease", "ModelManager", "Progress", "log_to_console"]

log = logging.getLogger(__name__)

DEFAULT_KEEP_ALIVE = 300.0  # Ollama's default too
# How long a model that failed to load answers its error at once instead of being read again:
# a broken file is not parsed (and a load not tried) per request.
DEFAULT_FAILED_LOAD_TTL = 30.0
# How long a request waits for room to load its model (--max-loaded reached, every loaded
# model busy) before 503 model_unavailable; what its Retry-After then says.
DEFAULT_LOAD_WAIT = 60.0
ROOM_RETRY_AFTER = 5
# How long a loaded model stays before an idle one may be unloaded to make room for another:
# requests that cycle through more models than --max-loaded do not load one per request.
DEFAULT_MIN_RESIDENCY = 10.0
# Ollama's default on a machine without GPUs; 0 means no bound.
DEFAULT_MAX_LOADED = 3
# How long a DELETE waits for a loaded model's thread to forget an owner's cached prompts (it
# runs between two decode steps: one step, unless the thread is stuck).
FORGET_WAIT = 30.0

# (model id, fraction loaded): called on the loading thread, from llama.cpp's progress callback.
Progress = Callable[[str, float], None]


class _Model:
    __slots__ = (
        "backend",
        "entry",
        "estimate",
        "failed",
        "holds",
        "id",
        "last_used",
        "loaded_at",
        "loading",
        "queued",
        "timer",
        "unloading",
    )

    def __init__(self, model_id: str, entry: ModelEntry | None, backend: Backend | None = None) -> None:
        self.id = model_id
        self.entry = entry  # None: a backend that came from outside (scripted), never unloaded
        self.backend = backend
        self.loading: asyncio.Future[Backend] | None = None
        self.unloading: asyncio.Future[None] | None = None
        # Given to --preload and not loading yet: its room is taken all the same.
        self.queued = False
        self.holds = 0
        self.last_used = time.monotonic()
        self.timer: asyncio.TimerHandle | None = None
        # The last load's failure, until when it is answered without trying again.
        self.failed: tuple[float, ProblemError] | None = None
        self.loaded_at = time.monotonic()  # for --min-residency
        self.estimate: int | None = None  # its memory once loaded, for --max-loaded-bytes

    @property
    def resident(self) -> bool:
        """Takes memory: loaded, or being loaded or unloaded, or queued to preload."""
        return self.backend is not None or self.loading is not None or self.unloading is not None or self.queued


class _Releasing:
    """A generation's sink that also lets its model go when the generation ends. Text goes
    straight to the inner sink (its own bound method: nothing is added per token)."""

    __slots__ = ("_done", "_sink", "on_text")

    def __init__(self, sink: Sink, done: Callable[[], None]) -> None:
        self.on_text = sink.on_text
        self._sink = sink
        self._done = done

    def __getattr__(self, name: str) -> Any:  # whatever else the sink offers
        return getattr(self._sink, name)

    def on_finish(self, reason: Any, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> None:
        try:
            self._sink.on_finish(reason, input_tokens, output_tokens, cached_tokens)
        finally:
            self._done()

    def on_error(self, message: str) -> None:
        try:
            self._sink.on_error(message)
        finally:
            self._done()


class Lease:
    """A model held for one response. Use it in a `with` block: leaving the block lets the
    model go, unless `submit` handed the hold to a generation, which lets it go when it ends."""

    def __init__(self, manager: ModelManager, model: _Model, backend: Backend) -> None:
        self.backend = backend
        self._manager = manager
        self._model = model
        self._loop = asyncio.get_running_loop()
        self._handed = False
        self._released = False

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._handed:
            self._release()

    def submit(self, request: GenerationRequest) -> Sequence:
        request.sink = _Releasing(request.sink, self._release_soon)
        sequence = self.backend.submit(request)
        self._handed = True
        return sequence

    def _release_soon(self) -> None:  # on the backend's thread
        try:
            self._loop.call_soon_threadsafe(self._release)
        except RuntimeError:  # the loop is closed: the service is stopping, nothing to free
            pass

    def _release(self) -> None:
        if not self._released:
            self._released = True
            self._manager._let_go(self._model)


# A Jinja chat template every model renders with instead of its file's own: for trying a
# template (a thinking model's, a fixed one) on the model at hand (docs/guides/thinking-models.md).
TEMPLATE_OVERRIDE_ENV = "LMSP_CHAT_TEMPLATE_FILE"


def _template_override() -> str | None:
    path = os.environ.get(TEMPLATE_OVERRIDE_ENV)
    return Path(path).read_text(encoding="utf-8") if path else None


class ModelManager:
    def __init__(
        self,
        entries: list[ModelEntry],
        config: SchedulerConfig,
        *,
        extra: dict[str, Backend] | None = None,
        gpu_layers: int | None = None,
        service_capabilities: tuple[str, ...] = (),
        keep_alive: float = DEFAULT_KEEP_ALIVE,
        max_loaded: int = 0,
        metrics: Metrics | None = None,
        failed_load_ttl: float = DEFAULT_FAILED_LOAD_TTL,
        load_wait: float = DEFAULT_LOAD_WAIT,
        min_residency: float = DEFAULT_MIN_RESIDENCY,
        max_loaded_bytes: int = 0,
    ) -> None:
        self._models = {e.id: _Model(e.id, e) for e in entries}
        for model_id, backend in (extra or {}).items():
            self._models.setdefault(model_id, _Model(model_id, None, backend))
        # What the service adds to every model, whatever its backend (e.g. `conversations`).
        self._service_capabilities = service_capabilities
        self._config = config
        self._gpu_layers = gpu_layers
        self._keep_alive = keep_alive
        self._max_loaded = max_loaded
        self._failed_load_ttl = failed_load_ttl
        self._load_wait = load_wait
        self._min_residency = min_residency
        self._max_bytes = max_loaded_bytes  # 0: no memory budget, only the count
        # Requests waiting for room to load their model, first come first served: only the
        # first may make room (unload an idle model) and take it.
        self._waiting: list[object] = []
        self._metrics = metrics  # counts loads and unloads (GET /metrics)
        self._changed: asyncio.Event | None = None
        self._aborting = False  # the service stops: a load under way ends at its next progress report

    @property
    def ids(self) -> list[str]:
        return list(self._models)

    def entry(self, model_id: str) -> ModelEntry | None:
        model = self._models.get(model_id)
        return model.entry if model is not None else None

    def resident(self) -> list[str]:
        """The models loaded or being loaded now (what a replica publishes: a sibling asking
        for one of them is better sent here than made to load it too)."""
        return [m.id for m in self._models.values() if m.resident and m.unloading is None]

    def saturated(self) -> bool:
        """Whether a loaded model's queue is full: new work here would wait or be refused."""
        return any(m.backend is not None and m.backend.full for m in self._models.values())

    def needs_load(self, model_id: str) -> bool:
        """Whether a request for it would wait for a load; 404 model_not_found for an id it
        does not serve."""
        model = self._model(model_id)
        return model.backend is None or not model.backend.alive

    def reserve(self, model_id: str) -> None:
        """Takes a `--preload`'s room now, before the service serves: `preload` loads it once
        it does, and requests for other models find that room taken meanwhile. 503
        model_unavailable when it does not fit what is left of --max-loaded-bytes."""
        model = self._model(model_id)
        if self._max_bytes > 0 and model.entry is not None:
            if model.estimate is None:
                model.estimate = self._estimate(model)  # counted against the budget from now on
            others = [m for m in self._models.values() if m is not model and m.entry is not None and m.resident]
            left = self._max_bytes - sum(m.estimate or 0 for m in others)
            if model.estimate > left:
                raise ProblemError(
                    "model_unavailable",
                    f"model {model_id!r} needs about {_mib(model.estimate)} MiB loaded; "
                    f"--max-loaded-bytes ({_mib(self._max_bytes)} MiB) has {_mib(max(0, left))} MiB left",
                )
        model.queued = True

    async def preload(self, model_id: str, progress: Progress | None = None) -> None:
        """Loads a model `reserve` took room for, on a thread, as the service serves (or waits
        for the load a request for it started first): requests for it wait for this load as for
        any. Raises the load's 503 model_unavailable, what the loader raised as its cause. Its
        keep-alive then starts, as if a request had just used it."""
        model = self._model(model_id)
        model.queued = False
        if model.unloading is not None:  # a request loaded it first, and it has been let go since
            await asyncio.shield(model.unloading)
        if model.backend is None:
            if model.loading is None:
                self._check_failed(model)
                model.loading = asyncio.ensure_future(self._load(model, progress))
            await asyncio.shield(model.loading)
        model.last_used = time.monotonic()
        if model.holds == 0 and model.timer is None:
            self._idle(model)

    async def lease(self, model_id: str) -> Lease:
        """Holds the model, loading it (or loading it again, if its backend stopped) when need
        be; 503 model_unavailable when it cannot be loaded."""
        note_model(model_id)  # the access log's model: the one asked for, found or not
        model = self._model(model_id)
        model.holds += 1
        if model.timer is not None:
            model.timer.cancel()
            model.timer = None
        try:
            backend = await self._ready(model)
        except BaseException:
            self._let_go(model)
            raise
        return Lease(self, model, backend)

    def unload(self, model_id: str) -> bool:
        """Unloads it now if it is loaded and nobody holds it (Ollama's `keep_alive: 0`); False
        when it is not loaded, or in use (it then unloads as its keep-alive says)."""
        model = self._model(model_id)
        if model.backend is None or model.entry is None or model.holds:
            return False
        if model.timer is not None:
            model.timer.cancel()
            model.timer = None
        self._unload(model)
        return True

    async def forget_cache_owner(self, owner_key: str) -> int:
        """Drops every cached prompt state of an owner (its `cache_owner_key`; a DELETE by that
        owner, issue 38): each loaded model's slots and memory tier on its own thread, then
        every model's disk tier files in the cache folder (models not loaded now, other model
        identities included), on a worker thread. A model being unloaded writes its states to
        disk first: the disk pass waits for that. Returns how many states went; raises what
        failed, after doing all it could."""
        failed: BaseException | None = None
        gone = 0
        waits = []
        for model in self._models.values():
            if model.backend is not None and model.backend.alive:
                try:
                    waits.append(asyncio.wrap_future(model.backend.forget_owner(owner_key)))
                except ModelUnavailable:  # stopped since: its unload writes to disk, the pass below reads
                    pass
        # Shielded: a thread that answers late still forgets (a cancelled job would be skipped).
        timed = (asyncio.wait_for(asyncio.shield(w), FORGET_WAIT) for w in waits)
        for result in await asyncio.gather(*timed, return_exceptions=True):
            if isinstance(result, ModelUnavailable):
                continue  # unloaded meanwhile: what it held is on disk now, or will be
            if isinstance(result, BaseException):
                failed = failed or result
            else:
                gone += result
        unloading = [m.unloading for m in self._models.values() if m.unloading is not None]
        if unloading:  # its close persists what memory held: the disk pass must come after
            await asyncio.wait([asyncio.shield(u) for u in unloading], timeout=FORGET_WAIT)
        # The local folder, and the shared one (other servers' files of that owner too).
        for folder in (self._config.cache_dir, self._config.cache_shared):
            if folder is None:
                continue
            try:
                gone += await asyncio.to_thread(forget_owner_files, folder, owner_key)
            except OSError as exc:
                failed = failed or exc
        if failed is not None:
            raise failed
        return gone

    async def get(self, model_id: str) -> Backend:
        """The model's backend, loaded if need be, without holding it."""
        with await self.lease(model_id) as lease:
            return lease.backend

    def capabilities(self, backend: Backend | None) -> list[str]:
        own = backend.capabilities if backend else LlamaBackend.capabilities
        return list(dict.fromkeys([*own, *self._service_capabilities]))

    def describe(self, model_id: str) -> dict[str, Any] | None:
        model = self._models.get(model_id)
        if model is None:
            return None
        backend = model.backend
        described: dict[str, Any] = {
            "id": model_id,
            "object": "model",
            "capabilities": self.capabilities(backend),
            "context_window": backend.context_window if backend else self._config.ctx_per_sequence,
            "backend": "llama.cpp" if model.entry is not None else "scripted",
            "device": backend.device if backend else _device(),
            # Until its memory is given back: one being unloaded still holds it.
            "loaded": backend is not None or model.unloading is not None,
        }
        if model.entry is not None:
            described["source"] = model.entry.source
        return described

    def describe_all(self) -> list[dict[str, Any]]:
        return [d for i in self.ids if (d := self.describe(i)) is not None]

    def abort_loads(self) -> None:
        """Stops the loads under way (the service is stopping): what waits for them gets 503
        model_unavailable, and the process does not wait for a large file to be read to the end."""
        self._aborting = True

    def close(self, closer: Callable[[Backend], None] = lambda b: b.close()) -> None:
        for model in self._models.values():
            if model.timer is not None:
                model.timer.cancel()
            if model.backend is not None:
                closer(model.backend)
                model.backend = None

    # --- loading and unloading, on the event loop -----------------------------------------

    def _model(self, model_id: str) -> _Model:
        model = self._models.get(model_id)
        if model is None:
            raise ProblemError(
                "model_not_found", f"no model {model_id!r}; GET /lmsp/v1/models lists them", param="model"
            )
        return model

    async def _ready(self, model: _Model) -> Backend:
        ticket: object | None = None  # its place among the waiters for room, once it waits
        deadline = 0.0
        if self._max_bytes > 0 and model.entry is not None and model.backend is None:
            self._check_failed(model)
            if model.estimate is None:  # its header is read once, off the event loop
                model.estimate = await asyncio.to_thread(self._estimate, model)
            if model.estimate > self._max_bytes:  # it would wait for room that never comes
                raise ProblemError(
                    "model_unavailable",
                    f"model {model.id!r} needs about {_mib(model.estimate)} MiB loaded, more than "
                    f"--max-loaded-bytes ({_mib(self._max_bytes)} MiB)",
                )
        try:
            while True:
                if model.unloading is not None:
                    await asyncio.shield(model.unloading)
                    continue
                backend = model.backend
                if backend is not None:
                    if backend.alive:
                        return backend
                    if model.entry is None:  # nothing to load it again from
                        raise ProblemError("model_unavailable", f"model {model.id!r} has stopped")
                    log.warning("model %s stopped; loading it again", model.id)
                    self._unload(model)
                    continue
                if model.loading is None:
                    self._check_failed(model)
                    first = not self._waiting or self._waiting[0] is ticket
                    if not (first and self._room_for(model)):
                        if ticket is None:
                            ticket = object()
                            self._waiting.append(ticket)
                            # A negative --load-wait (-1): no deadline.
                            deadline = time.monotonic() + self._load_wait if self._load_wait >= 0 else math.inf
                        await self._wait_for_room(model, deadline)
                        continue
                    model.loading = asyncio.ensure_future(self._load(model))
                if ticket is not None:  # it has its room (or another request's load): the next may go
                    self._waiting.remove(ticket)
                    ticket = None
                    self._notify()
                return await asyncio.shield(model.loading)
        finally:
            if ticket is not None:  # it gave up (deadline, client gone): the next in line may go
                self._waiting.remove(ticket)
                self._notify()

    async def _wait_for_room(self, model: _Model, deadline: float) -> None:
        """Waits for a change (a model let go or unloaded); 503 once `deadline` has passed."""
        left = deadline - time.monotonic()
        if left > 0:
            try:
                await asyncio.wait_for(self._change(), None if math.isinf(left) else left)
                return
            except TimeoutError:
                pass
        bounds = [f"--max-loaded {self._max_loaded}"] if self._max_loaded > 0 else []
        if self._max_bytes > 0:
            bounds.append(f"--max-loaded-bytes ({_mib(self._max_bytes)} MiB)")
        raise ProblemError(
            "model_unavailable",
            f"no room to load model {model.id!r}: the models loaded and in use take {' or '.join(bounds)}",
            headers=[("retry-after", str(ROOM_RETRY_AFTER))],
        )

    async def _load(self, model: _Model, progress: Progress | None = None) -> Backend:
        try:
            backend = await asyncio.to_thread(self._open, model, progress)
        except Exception as exc:  # the file changed or vanished since discovery, or is no GGUF
            log.warning("loading %s failed: %s", model.id, exc)  # the whole story, paths too
            error = ProblemError("model_unavailable", f"model {model.id!r} could not be loaded: {_reason(model, exc)}")
            if self._failed_load_ttl > 0:
                model.failed = (time.monotonic() + self._failed_load_ttl, error)
            raise error from exc  # the cause, paths and all, for a failed --preload's message
        else:
            model.backend = backend
            model.loaded_at = time.monotonic()
            return backend
        finally:
            model.loading = None
            self._notify()

    def _check_failed(self, model: _Model) -> None:
        """Raises the last load's error again while it is remembered, with a Retry-After for
        when a load will be tried again."""
        if model.failed is None:
            return
        until, error = model.failed
        left = until - time.monotonic()
        if left <= 0:
            model.failed = None
            return
        raise ProblemError(error.code, error.detail, headers=[("retry-after", str(math.ceil(left)))])

    def _estimate(self, model: _Model) -> int:
        assert model.entry is not None
        config = self._config
        path = model.entry.real or model.entry.path
        return estimate_bytes(path, ctx_per_sequence=config.ctx_per_sequence, n_parallel=config.n_parallel)

    def _open(self, model: _Model, progress: Progress | None) -> Backend:
        entry = model.entry
        assert entry is not None
        log.info("loading %s from %s", model.id, entry.path)
        started = time.monotonic()
        path = entry.path
        if entry.real is not None and entry.identity is not None:
            # Re-confined: the file discovery found, opened without following a link; what
            # llama.cpp opens is that resolved path (a split's first shard keeps its link's
            # name: llama.cpp finds the other shards by it), checked again once it has read it.
            confirm(entry.path, entry.real, entry.identity, entry.root)
            path = entry.real if len(shards(entry.path)) == 1 else entry.path
        backend = LlamaBackend(
            path,
            self._config,
            name=model.id,
            gpu_layers=self._gpu_layers,
            progress=_LoadLog(model.id, progress, lambda: self._aborting),
            chat_template=_template_override(),
        )
        if entry.real is not None and entry.identity is not None:
            try:  # swapped while llama.cpp read it: what it read may be any file
                confirm(entry.path, entry.real, entry.identity, entry.root)
            except Moved:
                backend.close()
                raise
        log.info("loaded %s in %.1f s", model.id, time.monotonic() - started)
        if progress is not None:
            progress(model.id, 1.0)  # whatever llama.cpp reported last, it is done
        if self._metrics is not None:
            self._metrics.model_loaded(model.id)
        return backend

    def _room_for(self, model: _Model) -> bool:
        """Whether `model` may start loading now; if not, unloads the least recently used idle
        models when that is what it takes (the caller then waits for a change). Room is both
        a count (--max-loaded) and bytes (--max-loaded-bytes); a model being unloaded still
        takes its room until its memory is given back."""
        if model.entry is None or (self._max_loaded <= 0 and self._max_bytes <= 0):
            return True
        resident = [m for m in self._models.values() if m is not model and m.entry is not None and m.resident]
        if not self._short(resident, model):
            return True
        staying = [m for m in resident if m.unloading is None]
        idle = [m for m in staying if m.backend is not None and m.holds == 0]
        now = time.monotonic()
        settled = sorted((m for m in idle if now - m.loaded_at >= self._min_residency), key=lambda m: m.last_used)
        while settled and self._short(staying, model):  # what is not leaving yet still falls short
            leaving = settled.pop(0)
            staying.remove(leaving)
            self._unload(leaving)
        if self._short(staying, model) and (waiting := [m for m in idle if m in staying]):
            # the waiter looks again when the first idle one has stayed long enough
            soonest = min(m.loaded_at for m in waiting) + self._min_residency - now
            asyncio.get_running_loop().call_later(max(0.0, soonest), self._notify)
        return False

    def _short(self, others: list[_Model], model: _Model) -> bool:
        """Whether `model` does not fit beside `others` (the count, or the bytes)."""
        if self._max_loaded > 0 and len(others) >= self._max_loaded:
            return True
        if self._max_bytes > 0:
            taken = sum(m.estimate or 0 for m in others)
            return taken + (model.estimate or 0) > self._max_bytes
        return False

    def _let_go(self, model: _Model) -> None:
        model.holds -= 1
        model.last_used = time.monotonic()
        if model.holds == 0:
            self._idle(model)
        self._notify()

    def _idle(self, model: _Model) -> None:
        """Held by nobody now: its keep-alive starts."""
        if model.backend is None or model.entry is None or self._keep_alive < 0:
            return
        if self._keep_alive == 0:
            self._unload(model)
        else:
            model.timer = asyncio.get_running_loop().call_later(self._keep_alive, self._expire, model)

    def _expire(self, model: _Model) -> None:
        model.timer = None
        if model.holds == 0 and model.backend is not None:
            self._unload(model)

    def _unload(self, model: _Model) -> None:
        backend, model.backend = model.backend, None
        assert backend is not None
        model.unloading = asyncio.ensure_future(self._close(model, backend))

    async def _close(self, model: _Model, backend: Backend) -> None:
        try:
            await asyncio.to_thread(backend.close)
            log.info("unloaded %s", model.id)
        except Exception:  # what it held is gone either way; the requests waiting go on
            log.exception("unloading %s failed", model.id)
        else:
            if self._metrics is not None:
                self._metrics.model_unloaded(model.id)
        finally:
            model.unloading = None
            self._notify()

    async def _change(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    def _notify(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = None


class _LoadLog:
    """llama.cpp's load progress: given to `progress` (a bar) when there is one, else logged
    every quarter; the load is stopped once `aborting` says so."""

    def __init__(self, model_id: str, progress: Progress | None, aborting: Callable[[], bool]) -> None:
        self._model_id = model_id
        self._progress = progress
        self._aborting = aborting
        self._logged = -1

    def __call__(self, fraction: float) -> None:
        if self._aborting():
            raise LoadAborted
        if self._progress is not None:
            self._progress(self._model_id, fraction)
            return
        quarter = int(fraction * 4)
        if quarter > self._logged:
            self._logged = quarter
            log.info("loading %s: %d%%", self._model_id, quarter * 25)


def log_to_console(stream: TextIO | None = None) -> None:
    """Loads (and their progress), unloads and reloads on stderr, for whoever runs `serve`."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter("lmsp: %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # a root handler would write each line twice


def _mib(n: int) -> int:
    return math.ceil(n / (1 << 20))


def _reason(model: _Model, exc: Exception) -> str:
    """Why a load failed, in words for a client: no file path (where the service keeps its
    models is not theirs to know), the log has the rest."""
    if isinstance(exc, Moved):
        return str(exc)
    text = str(exc) if isinstance(exc, (ModelLoadError, OSError)) else ""
    entry = model.entry
    for path in (entry.real, entry.path) if entry is not None else ():
        if path is not None:
            text = text.replace(str(path), "its file")
    if not text or os.sep in text:
        return "its file could not be read as a model (the service's log says why)"
    return text


@functools.cache
def _device() -> str:
    return device_of_build()
