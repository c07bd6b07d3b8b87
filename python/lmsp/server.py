"""Builds the service from its settings and serves it with granian (embedded, one process:
the models, their scheduler threads and the HTTP app share memory and one event loop)."""

from __future__ import annotations

import asyncio
import errno
import logging
import math
import signal
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path

from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.log import LogLevels
from granian.server.embed import Server

from .datadir import resolve_data_dir
from .engine.backends import Backend, ScriptedBackend, build_report, describe_build
from .engine.llama import BuildUnusable, check_build
from .engine.registry import ModelEntry, discover
from .engine.scheduler import SchedulerConfig
from .faces.anthropic import AnthropicFace
from .faces.lmsp.routes import LmspFace
from .faces.ollama.routes import OllamaFace
from .faces.openai.routes import OpenAIFace
from .http.app import DEFAULT_MAX_BODY, App
from .http.face import Services
from .http.forward import Forwarder
from .http.replays import DEFAULT_MAX_REPLAY_BODY, DEFAULT_TTL, Replays
from .http.sse import KEEPALIVE_SECONDS
from .loadbar import LoadBar
from .observability.accesslog import start_access_log
from .observability.metrics import Metrics
from .observability.observer import Observer
from .protocol.errors import ProblemError
from .security.cors import Cors
from .security.guard import Guard
from .security.hosts import is_loopback_address
from .security.limits import Limits, StreamSlots
from .security.usage import report_now, report_usage
from .service.conversations import (
    DEFAULT_STORE_QUOTA,
    DEFAULT_STORE_QUOTA_BYTES,
    DEFAULT_STORE_RETENTION,
    Conversations,
)
from .service.models import (
    DEFAULT_FAILED_LOAD_TTL,
    DEFAULT_KEEP_ALIVE,
    DEFAULT_LOAD_WAIT,
    DEFAULT_MAX_LOADED,
    DEFAULT_MIN_RESIDENCY,
    ModelManager,
    Progress,
    log_to_console,
)
from .service.readiness import Readiness
from .service.responses import CacheScope, ResponsesService
from .service.tasks import (
    DEFAULT_RETENTION,
    DEFAULT_TASK_BYTES,
    DEFAULT_TASK_EVENTS,
    TasksService,
)
from .state import DEFAULT_EVENTS, DEFAULT_STORE, State, StateConfig, StateError, backend, open_state
from .tokens import Tokens

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "ServeError",
    "Service",
    "Settings",
    "build_app",
    "check_port",
    "check_readable",
    "serve",
]


# How long a SIGTERM lets running generations finish before it ends them (docs/operations/several-machines.md).
DEFAULT_DRAIN_TIMEOUT = 30.0


class ServeError(Exception):
    """The service cannot start; the message says why, for a person."""


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8750
    model_dirs: list[Path] = field(default_factory=list)
    # Ollama's store, the Hugging Face cache and LM Studio's folder too (False: --no-discover).
    discover_stores: bool = True
    # How long an idle model stays loaded (0: unloaded at once; -1: for ever), how many may be
    # loaded at once (0: no bound), and which are loaded before serving.
    keep_alive: float = DEFAULT_KEEP_ALIVE
    max_loaded: int = DEFAULT_MAX_LOADED
    # The memory they may take together, each estimated from its GGUF (0: no budget).
    max_loaded_bytes: int = 0
    # How long a model that failed to load answers that error at once (0: tried every time).
    failed_load_ttl: float = DEFAULT_FAILED_LOAD_TTL
    # How long a request waits for room to load its model before 503.
    load_wait: float = DEFAULT_LOAD_WAIT
    # How long a loaded model stays before it may be unloaded to make room for another.
    min_residency: float = DEFAULT_MIN_RESIDENCY
    preload: list[str] = field(default_factory=list)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    gpu_layers: int | None = None
    max_body: int = DEFAULT_MAX_BODY
    keepalive: float = KEEPALIVE_SECONDS
    # A scripted model next to the real ones: for protocol tests and benchmarks.
    scripted_model: str | None = None
    # None: $LMSP_HOME, else the platform's user data folder.
    data_dir: Path | None = None
    idempotency_ttl: float = DEFAULT_TTL
    idempotency_max_body: int = DEFAULT_MAX_REPLAY_BODY
    # Stored responses: how long they are kept (0 or less: for ever) and how many per owner
    # (0: no bound); see docs/operations/limits.md.
    store_retention: float = DEFAULT_STORE_RETENTION
    store_quota: int = DEFAULT_STORE_QUOTA
    store_quota_bytes: int = DEFAULT_STORE_QUOTA_BYTES
    # A task's event ring, and how long its events outlive it (§7 retention).
    task_events_max: int = DEFAULT_TASK_EVENTS
    task_events_bytes: int = DEFAULT_TASK_BYTES
    task_retention: float = DEFAULT_RETENTION
    # Several replicas: a PostgreSQL store and Redis Streams for task events (README: Several
    # machines); None: the embedded SQLite store and events in this process.
    store_url: str | None = None
    events_url: str | None = None
    task_lease: float = 10.0
    # Where sibling replicas reach this one (http://host:port; no port: --port's): set, it
    # publishes its models and sends requests for a model a sibling holds there (needs
    # --events redis://…); None: every request is served here (docs/operations/replicas.md).
    advertise_url: str | None = None
    # Connections answered at once. Task readers hold theirs for as long as a task runs and
    # cost little each; granian's embedded default (128) would leave the 129th unanswered.
    max_connections: int = 4096
    # How long open streams get to send their last event when the service stops.
    shutdown_grace: float = 2.0
    # SIGTERM: how long running generations get to finish, new work refused meanwhile (0: none,
    # they end at once as the service stops; negative: no deadline, until a second signal).
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    # Origins whose pages may call the service (CORS); none by default.
    cors_origins: frozenset[str] = frozenset()
    limits: Limits = field(default_factory=Limits)
    # Whose cached prompts a request may reuse: its owner's (default) or everyone's
    # (service/responses.py, CacheScope; docs/operations/prompt-cache.md).
    cache_scope: CacheScope = "owner"
    # Whether a JSON schema is narrowed before it is compiled (engine/schema_check.py, `relax`).
    schema_narrowing: bool = True
    # GET /metrics and what feeds it; off only to measure what it costs (bench/suites/bench_metrics.py).
    metrics: bool = True
    access_log: bool = True
    log_format: str = "text"  # of the access log: text or json


def check_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ServeError(f"port {port} on {host} is already in use (is another lmsp running?)") from None
            raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def check_readable(entries: list[ModelEntry]) -> None:
    for entry in entries:
        try:
            with entry.path.open("rb") as f:
                magic = f.read(4)
        except OSError as exc:
            raise ServeError(f"cannot read model file {entry.path}: {exc.strerror}") from None
        if magic != b"GGUF":
            raise ServeError(f"{entry.path} is not a GGUF file")


@dataclass
class Service:
    """Everything `serve` runs, and what must be closed when it stops."""

    app: App
    models: ModelManager
    state: State  # the store, task events and tokens
    tasks: TasksService | None = None
    # The models it loads as it starts serving, their room already taken (ModelManager.reserve).
    preload: list[str] = field(default_factory=list)

    def close(self) -> None:
        self.models.close()
        self.state.close()


def state_config(settings: Settings) -> StateConfig:
    """Where each kind of state is kept: the registry (state/registry.py) opens the backend
    each URL's scheme names."""
    return StateConfig(
        data_dir=resolve_data_dir(settings.data_dir),
        store_url=settings.store_url or DEFAULT_STORE,
        events_url=settings.events_url or DEFAULT_EVENTS,
        task_events_max=settings.task_events_max,
        task_events_bytes=settings.task_events_bytes,
        task_retention=settings.task_retention,
        task_lease=settings.task_lease,
    )


def open_guarded_state(settings: Settings) -> State:
    """The state bundle; refuses (§10) to serve beyond loopback without a token."""
    try:
        state = open_state(state_config(settings))
    except StateError as exc:
        raise ServeError(str(exc)) from None
    if not is_loopback_address(settings.host) and not state.tokens.any_active():
        state.close()
        raise ServeError(
            f"refusing to listen on {settings.host} without tokens: anyone who can reach it could use it. "
            "Create one with `lmsp token create --scopes models:read,responses:write,responses:read` "
            "(same --data-dir, or same --store), or listen on 127.0.0.1"
        )
    return state


def advertised(url: str, port: int) -> str:
    """`--advertise-url` as siblings use it: http(s)://host:port with no path; the port is
    --port's when the URL names none."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        given = parts.port
    except ValueError:
        raise ServeError(f"--advertise-url {url!r} is not a URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ServeError(f"--advertise-url {url!r}: give http://host:port, the address siblings reach this replica at")
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ServeError(f"--advertise-url {url!r}: only a scheme, a host and a port (no path, query or credentials)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{given if given is not None else port}"


def preloads(settings: Settings, entries: list[ModelEntry]) -> list[str]:
    """`--preload`'s models; without it, the embedded default when it is the only model."""
    ids = {e.id for e in entries}
    for model_id in settings.preload:
        if model_id not in ids:
            raise ServeError(f"--preload {model_id}: no such model (`lmsp models` lists them)")
    if not settings.preload and len(entries) == 1 and entries[0].source == "embedded":
        return [entries[0].id]
    preload = list(dict.fromkeys(settings.preload))
    if 0 < settings.max_loaded < len(preload):
        raise ServeError(
            f"--preload names {len(preload)} models, more than --max-loaded {settings.max_loaded} lets be loaded"
        )
    return preload


def build_app(settings: Settings) -> Service:
    advertise = advertised(settings.advertise_url, settings.port) if settings.advertise_url else None
    if advertise is not None:
        try:
            shared = backend(settings.events_url or DEFAULT_EVENTS).shared
        except StateError as exc:
            raise ServeError(str(exc)) from None
        if not shared:
            raise ServeError(
                "--advertise-url routes between replicas, which learn of each other through the task "
                "event log they share: add --events redis://… (and --store postgresql://…)"
            )
    state = open_guarded_state(settings)
    store, tokens = state.store, state.tokens
    entries = discover(settings.model_dirs, from_stores=settings.discover_stores)
    check_readable(entries)
    if entries:
        try:
            check_build()
        except BuildUnusable as exc:
            raise ServeError(str(exc)) from None
    preload = preloads(settings, entries)
    extra: dict[str, Backend] = {}
    if settings.scripted_model:
        extra[settings.scripted_model] = ScriptedBackend(max_queue=settings.scheduler.max_queue)
    if not entries and not extra:
        raise ServeError("no models: the embedded model is not installed and no --model-dir holds a .gguf")
    # `models` is bound below, before any scrape can ask how many are loaded.
    metrics = Metrics(loaded=lambda: sum(d["loaded"] for d in models.describe_all())) if settings.metrics else None
    scheduler = replace(settings.scheduler, stats=metrics.engine) if metrics is not None else settings.scheduler
    models = ModelManager(
        entries,
        scheduler,
        extra=extra,
        gpu_layers=settings.gpu_layers,
        service_capabilities=("conversations",),
        keep_alive=settings.keep_alive,
        max_loaded=settings.max_loaded,
        metrics=metrics,
        failed_load_ttl=settings.failed_load_ttl,
        load_wait=settings.load_wait,
        min_residency=settings.min_residency,
        max_loaded_bytes=settings.max_loaded_bytes,
    )
    reserved: list[str] = []
    for model_id in preload:
        try:
            models.reserve(model_id)
        except ProblemError as exc:  # past --max-loaded-bytes
            if not settings.preload:  # only the default preload: it loads (or is refused) on first use
                continue
            raise ServeError(f"--preload {model_id}: {exc.detail}") from None
        reserved.append(model_id)
    conversations = Conversations(
        store,
        retention=settings.store_retention,
        quota=settings.store_quota,
        quota_bytes=settings.store_quota_bytes,
    )
    responses = ResponsesService(
        models, conversations, cache_scope=settings.cache_scope, schema_narrowing=settings.schema_narrowing
    )
    tasks = TasksService(
        responses,
        store,
        max_events=settings.task_events_max,
        max_bytes=settings.task_events_bytes,
        retention=settings.task_retention,
        events=state.events,
    )
    services = Services(
        responses,
        models,
        tasks,
        Replays(store, ttl=settings.idempotency_ttl, max_body=settings.idempotency_max_body),
        settings.limits,
        StreamSlots(settings.limits),
        max_body=settings.max_body,
        keepalive=settings.keepalive,
        readiness=Readiness([("store_unreachable", store.ping), ("events_unreachable", state.events.ping)]),
    )
    services.readiness.loading = bool(reserved)
    forwarder = None
    if advertise is not None:
        forwarder = Forwarder(
            state.residency,
            advertise,
            models=models.resident,
            known=lambda model_id: model_id in models.ids,
            busy=lambda: responses.closing or models.saturated(),
            metrics=metrics,
        )
        responses.on_stored = forwarder.produced  # a stored response's next turn is sent here
    app = App(
        services,
        # The faces this service speaks; a path's errors are written by the first that owns it
        # (Anthropic's /v1/messages before OpenAI's /v1), the last writes those no face owns.
        [AnthropicFace(services), OpenAIFace(services), OllamaFace(services), LmspFace(services)],
        guard=Guard(tokens),
        cors=Cors(settings.cors_origins),
        observer=Observer(metrics, access=settings.access_log) if metrics is not None or settings.access_log else None,
        forwarder=forwarder,
    )
    return Service(app, models, state, tasks, reserved)


async def _preload(app: App, preload: list[str], progress: Progress | None) -> None:
    """Loads the models given to `--preload` one after another as the service serves: ready
    once all have loaded; ServeError for the first that cannot load (the service then stops)."""
    for model_id in preload:
        try:
            await app.models.preload(model_id, progress)
        except ProblemError as exc:  # llama.cpp refused the file: say which, and why
            entry = app.models.entry(model_id)
            where = entry.path if entry is not None else model_id
            raise ServeError(f"--preload {model_id}: cannot load {where}: {exc.__cause__ or exc.detail}") from None
    app.readiness.loading = False


async def _drain(app: App, timeout: float, stop_now: asyncio.Event) -> None:
    """Not ready, no new work; returns once what was running has ended and been written to
    its readers, at the deadline, or at a second signal."""
    app.drain()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (timeout if timeout > 0 else math.inf)
    log.warning(
        "draining: no new work; running generations get %s to finish",
        f"{timeout:g} s" if timeout > 0 else "until a second signal",
    )
    while not (app.working == 0 and app.responses.idle()):
        if stop_now.is_set() or loop.time() >= deadline:
            log.warning("draining: stopping with generations still running")
            return
        await asyncio.sleep(0.05)


async def _serve(
    server: Server,
    app: App,
    grace: float,
    tasks: TasksService | None = None,
    tokens: Tokens | None = None,
    drain: float = 0.0,
    preload: list[str] | None = None,
    progress: Progress | None = None,
) -> None:
    """Serves until SIGTERM or SIGINT; then drains for up to `drain` seconds (0: not at all),
    then open streams end with an `error` event and get `grace` seconds to send it before
    granian closes the connections. A second signal cuts the drain short. `tokens`: where what
    each token used is reported. `preload`: the models loaded as it serves (`progress` shows
    how far); one that fails stops it at once, and its ServeError is raised."""
    if tasks is not None:
        await tasks.start()  # on this loop: the shared event log's listeners live here
    reporting = asyncio.ensure_future(report_usage(app.limiter, tokens)) if tokens is not None else None
    loop = asyncio.get_running_loop()
    if app.forwarder is not None:
        await app.forwarder.start()  # siblings learn of this replica before it serves
    app.readiness.start()
    stopping, stop_now = asyncio.Event(), asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: (stop_now if stopping.is_set() else stopping).set())
    serving = asyncio.ensure_future(server.serve())
    preloading = asyncio.ensure_future(_preload(app, preload or [], progress))
    watched = {serving, asyncio.ensure_future(stopping.wait()), preloading}
    while True:  # until a signal, the server's end, or a preload that fails (not one that loads)
        done, watched = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if done != {preloading} or preloading.exception() is not None:
            break
    failed = preloading.exception() if preloading.done() else None
    preloading.cancel()  # stopping before they have all loaded: the rest are not started
    if app.forwarder is not None:
        await app.forwarder.withdraw()  # siblings stop sending work here at once
    if not serving.done():
        if drain != 0 and failed is None:  # a service that failed to start has nothing to finish
            await _drain(app, drain, stop_now)
        app.models.abort_loads()  # a large model half read would hold the exit until it is whole
        app.shutdown()
        deadline = loop.time() + grace
        while app.active and loop.time() < deadline:
            await asyncio.sleep(0.02)
        server.stop()  # type: ignore[no-untyped-call]
        await serving
    await app.responses.drain()  # the ends the shutdown sent, kept before the store closes
    if app.forwarder is not None:
        await app.forwarder.aclose()
    await app.readiness.aclose()
    if tasks is not None:
        await tasks.aclose()
    if reporting is not None and tokens is not None:
        reporting.cancel()
        await report_now(app.limiter, tokens)  # the last seconds' counts, before the tokens close
    if failed is not None:
        raise failed


def serve(settings: Settings) -> None:
    check_port(settings.host, settings.port)
    log_to_console()
    service = build_app(settings)
    access_log = start_access_log(settings.log_format) if settings.access_log else None
    app, models = service.app, service.models
    print(f"lmsp listening on http://{settings.host}:{settings.port}/lmsp/v1", flush=True)
    print(f"  playground http://{settings.host}:{settings.port}/", flush=True)
    if any(described["backend"] == "llama.cpp" for described in models.describe_all()):
        print(f"  {describe_build(build_report())}", flush=True)
    for described in models.describe_all():
        state = "loaded" if described["loaded"] else "loads on first use"
        if described["id"] in service.preload:
            state = "loading"  # as it serves: GET /ready answers `loading` until it has
        where = f"{described['source']}, " if "source" in described else ""
        print(f"  model {described['id']} ({where}{described['backend']}, {described['device']}, {state})", flush=True)
    server = Server(
        app,
        address=settings.host,
        port=settings.port,
        interface=Interfaces.RSGI,
        # HTTP/1.1 only: an HTTP/2 preface is closed at once. With HTTP/2 on, a connection
        # that sends the preface and no more is held with no timer (hyper bounds no handshake).
        http=HTTPModes.http1,
        backlog=1024,
        backpressure=settings.max_connections,
        # Slowloris: a client gets this long to send its headers, on a new connection or an
        # idle kept-alive one (the body's pauses are timed by the app).
        http1_settings=HTTP1Settings(header_read_timeout=int(settings.limits.header_timeout * 1000)),
        log_level=LogLevels.error,  # granian's start-up chatter would bury the lines above
    )
    try:
        asyncio.run(
            _serve(
                server,
                app,
                settings.shutdown_grace,
                service.tasks,
                service.state.tokens,
                settings.drain_timeout,
                service.preload,
                LoadBar(),
            )
        )
    finally:
        service.close()
        if access_log is not None:
            access_log.stop()  # writes the lines still queued
